#pragma once

// A store in a file on a filesystem every rank sees (`file://path`).

#include <corocoll/core/error.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/version.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

/// A store in a file that every rank can open, for `file://path` on a shared filesystem.
/// The file is an append-only log of records (set or delete), so a rank only reads what was
/// appended since its last look; every operation holds an exclusive `flock` while it reads
/// and appends. Waiting polls the file every 10 ms on the reactor's timer (the reactor keeps
/// running meanwhile). Not wire-compatible with c10d's FileStore.
class file_store final : public store {
public:
    /// A store in the file at `path` (created if missing) shared by every rank that names it; waits
    /// time out after `timeout`.
    explicit file_store(std::string path, duration timeout = default_timeout);
    file_store(const file_store&) = delete;
    file_store& operator=(const file_store&) = delete;
    ~file_store() override { ::close(fd_); }

    /// The file the store lives in.
    const std::string& path() const noexcept { return path_; }

    COROCOLL_DECL task<> set(std::string key, std::string value) override;

    COROCOLL_DECL task<std::string> get(std::string key) override;

    COROCOLL_DECL task<std::int64_t> add(std::string key, std::int64_t delta) override;

    COROCOLL_DECL task<std::string> compare_set(std::string key, std::string expected,
                                                std::string desired) override;

    COROCOLL_DECL task<> wait(std::vector<std::string> keys, duration timeout) override;
    using store::wait;

    COROCOLL_DECL task<bool> check(std::vector<std::string> keys) override;

    COROCOLL_DECL task<bool> delete_key(std::string key) override;

    COROCOLL_DECL task<std::int64_t> num_keys() override;

private:
    enum : unsigned char { record_set = 1, record_delete = 2 };

    // Holds the file lock and brings data_ up to date with what others appended.
    class locked {
    public:
        explicit locked(file_store& s);
        locked(const locked&) = delete;
        locked& operator=(const locked&) = delete;
        ~locked() { ::flock(s_.fd_, LOCK_UN); }

    private:
        file_store& s_;
    };

    bool all_present(const std::vector<std::string>& keys) const;

    void catch_up();

    void append(unsigned char kind, const std::string& key, const std::string& value);

    void read_at(char* p, std::size_t n, std::uint64_t at);

    void write_at(const char* p, std::size_t n, std::uint64_t at);

    std::string path_;
    int fd_ = -1;
    std::uint64_t offset_ = 0;
    std::map<std::string, std::string> data_;
};

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/file_store.ipp>
#endif
