#pragma once

// The torch backend, part 1 of 7: torch's c10d::Store as a corocoll store.
// A private header of backend.cpp, the backend's one translation unit, which includes it after
// torch's and corocoll's headers and the parts before it.

namespace corocoll_torch {

/// corocoll's store interface over the c10d::Store torch hands the backend (a PrefixStore over
/// a TCPStore, FileStore or HashStore). c10d's calls block (TCPStore's client serialises them
/// behind one lock anyway), so each runs on the store thread (`pool`, one worker) and the
/// reactor goes on meanwhile. c10d's errors become corocoll's: a wait that ends at its timeout
/// is `std::errc::timed_out` naming the keys, which set-up's roll call relies on.
class torch_store final : public cc::rendezvous::store {
public:
    torch_store(c10::intrusive_ptr<c10d::Store> s, cc::thread_pool& pool)
        : cc::rendezvous::store(s->getTimeout()), store_(std::move(s)), pool_(pool) {}

    cc::task<> set(std::string key, std::string value) override {
        co_await call("set", key, [&] { store_->set(key, to_vec(value)); });
    }
    cc::task<std::string> get(std::string key) override {
        auto wait = timeout();
        co_return co_await call("get", key, [&] {
            // c10d's get waits for the store's own timeout: ours is the one that counts.
            std::vector<std::string> keys{key};
            store_->wait(keys, at_least_1ms(wait));
            return to_str(store_->get(key));
        });
    }
    cc::task<std::int64_t> add(std::string key, std::int64_t delta) override {
        co_return co_await call("add", key, [&] { return store_->add(key, delta); });
    }
    cc::task<std::string> compare_set(std::string key, std::string expected,
                                      std::string desired) override {
        co_return co_await call("compare_set", key, [&] {
            return to_str(store_->compareSet(key, to_vec(expected), to_vec(desired)));
        });
    }
    /// Looks (CHECK) until every key is there, from 1 ms apart doubling to 16 ms, on the
    /// calling coroutine's reactor. Not c10d's WAIT: a torch 1.13 client whose WAIT timed out
    /// reads the server's late answer as the reply to its next request (a shrink's or a
    /// grow's short waits time out by design, and the same client serves the group after).
    cc::task<> wait(std::vector<std::string> keys, duration t) override {
        const auto until = std::chrono::steady_clock::now() + t;
        auto pause = milliseconds(1);
        cc::io::reactor* r = cc::io::reactor::current();
        if (r == nullptr) {  // off a reactor: nothing to sleep on, c10d's own wait
            co_await call("wait", cc::rendezvous::detail::join_keys(keys),
                          [&] { store_->wait(keys, at_least_1ms(t)); });
            co_return;
        }
        while (!co_await check(keys)) {
            auto now = std::chrono::steady_clock::now();
            if (now >= until) {
                cc::detail::throw_error(
                    std::make_error_code(std::errc::timed_out),
                    "corocoll: torch store: wait for " + cc::rendezvous::detail::join_keys(keys) +
                        " timed out after " + std::to_string(t.count()) + " ms");
            }
            co_await r->sleep_until(std::min(now + pause, until));
            pause = std::min(pause * 2, milliseconds(16));
        }
    }
    cc::task<bool> check(std::vector<std::string> keys) override {
        co_return co_await call("check", cc::rendezvous::detail::join_keys(keys),
                                [&] { return store_->check(keys); });
    }
    cc::task<bool> delete_key(std::string key) override {
        co_return co_await call("delete_key", key, [&] { return store_->deleteKey(key); });
    }
    cc::task<std::int64_t> num_keys() override {
        co_return co_await call("num_keys", "", [&] { return store_->getNumKeys(); });
    }

    static std::string first_line(const char* what) {
        std::string s = what;
        auto nl = s.find('\n');
        return nl == std::string::npos ? s : s.substr(0, nl);
    }

private:
    static milliseconds at_least_1ms(milliseconds t) {
        // 0 means "no timeout" to c10d.
        return std::max(t, milliseconds(1));
    }
    static std::vector<std::uint8_t> to_vec(const std::string& s) {
        return std::vector<std::uint8_t>(s.begin(), s.end());
    }
    static std::string to_str(const std::vector<std::uint8_t>& v) {
        return std::string(v.begin(), v.end());
    }

    template <class F>
    auto call(const char* what, std::string keys, F fn) -> cc::task<decltype(fn())> {
        try {
            co_return co_await cc::offload(pool_, std::move(fn));
        } catch (const std::exception& e) {
            throw std::runtime_error(std::string("corocoll: torch store: ") + what + " '" + keys +
                                     "': " + first_line(e.what()));
        }
    }

    c10::intrusive_ptr<c10d::Store> store_;
    cc::thread_pool& pool_;
};

/// The store under every PrefixStore of `s`: the job's own (torch's TCPStore, or a FileStore),
/// the same for every group and every process of the job, however torch prefixed it.
inline c10::intrusive_ptr<c10d::Store> base_store(c10::intrusive_ptr<c10d::Store> s) {
    while (auto* prefix = dynamic_cast<c10d::PrefixStore*>(s.get())) {
        s = prefix->getUnderlyingStore();
    }
    return s;
}

/// Where torch's store is served, when it is a TCPStore (under any number of PrefixStores):
/// the address the mesh listens on is chosen to reach it, as corocoll's own init does.
inline std::optional<cc::io::endpoint> store_master(c10::intrusive_ptr<c10d::Store> s) {
    s = base_store(std::move(s));
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) {
        try {
            return cc::io::endpoint::resolve(tcp->getHost(), tcp->getPort());
        } catch (const std::exception&) {
        }
    }
    return std::nullopt;
}

}  // namespace corocoll_torch
