// The bodies of the non-template functions declared in <corocoll/rendezvous/file_store.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/file_store.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

COROCOLL_DECL file_store::file_store(std::string path, duration timeout)
    : store(timeout), path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) corocoll::detail::throw_errno(errno, "corocoll: file store: open " + path_);
}

COROCOLL_DECL task<> file_store::set(std::string key, std::string value) {
    locked l(*this);
    append(record_set, key, value);
    co_return;
}

COROCOLL_DECL task<std::string> file_store::get(std::string key) {
    // Named: g++ 12.2 rejects an initializer_list temporary inside co_await
    // ("array used as initializer").
    std::vector<std::string> keys{key};
    co_await wait(std::move(keys), timeout());
    locked l(*this);
    co_return data_.at(key);
}

COROCOLL_DECL task<std::int64_t> file_store::add(std::string key, std::int64_t delta) {
    locked l(*this);
    std::int64_t value = delta;
    if (auto it = data_.find(key); it != data_.end()) {
        value = detail::checked_add(key, detail::parse_store_int(key, it->second), delta);
    }
    append(record_set, key, std::to_string(value));
    co_return value;
}

COROCOLL_DECL task<std::string> file_store::compare_set(std::string key, std::string expected,
                                                        std::string desired) {
    locked l(*this);
    auto it = data_.find(key);
    if (it == data_.end()) {
        if (!expected.empty()) co_return expected;
    } else if (it->second != expected) {
        co_return it->second;
    }
    append(record_set, key, desired);
    co_return desired;
}

COROCOLL_DECL task<> file_store::wait(std::vector<std::string> keys, duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    io::reactor* r = io::reactor::current();
    if (r == nullptr) {
        throw std::logic_error("corocoll: file store: wait needs an io::reactor on this thread");
    }
    for (;;) {
        {
            locked l(*this);
            if (all_present(keys)) co_return;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            corocoll::detail::throw_error(std::make_error_code(std::errc::timed_out),
                                          "corocoll: file store " + path_ + ": wait for " +
                                              detail::join_keys(keys) + " timed out after " +
                                              std::to_string(timeout.count()) + " ms");
        }
        co_await r->sleep_for(std::chrono::milliseconds(10));
    }
}

COROCOLL_DECL task<bool> file_store::check(std::vector<std::string> keys) {
    locked l(*this);
    co_return all_present(keys);
}

COROCOLL_DECL task<bool> file_store::delete_key(std::string key) {
    locked l(*this);
    if (data_.count(key) == 0) co_return false;
    append(record_delete, key, {});
    co_return true;
}

COROCOLL_DECL task<std::int64_t> file_store::num_keys() {
    locked l(*this);
    co_return static_cast<std::int64_t>(data_.size());
}

COROCOLL_DECL file_store::locked::locked(file_store& s) : s_(s) {
    while (::flock(s_.fd_, LOCK_EX) != 0) {
        if (errno != EINTR) {
            corocoll::detail::throw_errno(errno, "corocoll: file store: flock " + s_.path_);
        }
    }
    try {
        s_.catch_up();
    } catch (...) {
        ::flock(s_.fd_, LOCK_UN);
        throw;
    }
}

COROCOLL_DECL bool file_store::all_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
        if (data_.count(k) == 0) return false;
    }
    return true;
}

COROCOLL_DECL void file_store::catch_up() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: file store: stat " + path_);
    }
    auto size = static_cast<std::uint64_t>(st.st_size);
    if (size <= offset_) return;
    std::string chunk(size - offset_, '\0');
    read_at(chunk.data(), chunk.size(), offset_);
    std::size_t pos = 0;
    auto take = [&](std::size_t n) {
        if (chunk.size() - pos < n) {
            throw std::runtime_error("corocoll: file store " + path_ + " is truncated or corrupt");
        }
        std::string out = chunk.substr(pos, n);
        pos += n;
        return out;
    };
    auto take_len = [&] {
        std::uint64_t n = 0;
        std::memcpy(&n, take(sizeof(n)).data(), sizeof(n));
        return static_cast<std::size_t>(n);
    };
    while (pos < chunk.size()) {
        auto kind = static_cast<unsigned char>(take(1)[0]);
        std::string key = take(take_len());
        std::string value = take(take_len());
        if (kind == record_set) {
            data_[std::move(key)] = std::move(value);
        } else {
            data_.erase(key);
        }
    }
    offset_ = size;
}

COROCOLL_DECL void file_store::append(unsigned char kind, const std::string& key,
                                      const std::string& value) {
    std::string rec(1, static_cast<char>(kind));
    auto put_len = [&](std::uint64_t n) {
        rec.append(reinterpret_cast<const char*>(&n), sizeof(n));
    };
    put_len(key.size());
    rec += key;
    put_len(value.size());
    rec += value;
    write_at(rec.data(), rec.size(), offset_);
    offset_ += rec.size();
    if (kind == record_set) {
        data_[key] = value;
    } else {
        data_.erase(key);
    }
}

COROCOLL_DECL void file_store::read_at(char* p, std::size_t n, std::uint64_t at) {
    while (n > 0) {
        ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            corocoll::detail::throw_errno(got < 0 ? errno : EIO,
                                          "corocoll: file store: read " + path_);
        p += got;
        n -= static_cast<std::size_t>(got);
        at += static_cast<std::uint64_t>(got);
    }
}

COROCOLL_DECL void file_store::write_at(const char* p, std::size_t n, std::uint64_t at) {
    while (n > 0) {
        ssize_t put = ::pwrite(fd_, p, n, static_cast<off_t>(at));
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) corocoll::detail::throw_errno(errno, "corocoll: file store: write " + path_);
        p += put;
        n -= static_cast<std::size_t>(put);
        at += static_cast<std::uint64_t>(put);
    }
}

}  // namespace rendezvous

COROCOLL_END_NAMESPACE
