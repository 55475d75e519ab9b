#pragma once

// CUDA runtime helpers of the GPU layer: errors that name the call, streams, events, device
// memory. Only the include-gpu root includes CUDA headers; nothing under include/ does.

#include <corocoll/version.hpp>

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace gpu {

/// A CUDA runtime call that failed: `what()` names the call (and the operation and rank where
/// the caller knows them) and CUDA's own name and text of the error.
class cuda_error : public std::runtime_error {
public:
    cuda_error(cudaError_t code, const std::string& what)
        : std::runtime_error(what + ": " + cudaGetErrorName(code) + " (" +
                             cudaGetErrorString(code) + ")"),
          code_(code) {}
    cudaError_t code() const noexcept { return code_; }

private:
    cudaError_t code_;
};

/// Throws `cuda_error` for a failed call; `what` says which call and where.
inline void check_cuda(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();  // a sticky error stays; others are cleared
        throw cuda_error(rc, std::string("corocoll: ") + what);
    }
}

/// CUDA devices this process sees; 0 where there is no driver or no device. Never throws.
inline int device_count() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/// Why `device_count()` is 0, in CUDA's words ("no CUDA-capable device is detected", ...);
/// empty where devices are seen.
inline std::string no_device_reason() {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc == cudaSuccess) return n > 0 ? std::string() : std::string("no CUDA device");
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(rc)) + " (" + cudaGetErrorString(rc) + ")";
}

/// `device_count()` asked in a short-lived child process, so that this process has not
/// initialised CUDA and may still fork ranks (a child forked after CUDA is initialised cannot
/// use it). 0 where the child fails too.
inline int probe_devices() noexcept {
    pid_t pid = ::fork();
    if (pid < 0) return 0;
    if (pid == 0) ::_exit(std::min(device_count(), 100));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return 0;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

/// Makes `device` the calling thread's current CUDA device (cudaSetDevice) until destroyed,
/// then restores the caller's. The current device belongs to the host thread, and any
/// coroutine on it may change it while another is suspended: hold one only across code that
/// does not suspend, right before the call that creates or uses a device's stream, event or
/// memory. Costs a cudaGetDevice, and two cudaSetDevice where the devices differ.
class device_guard {
public:
    explicit device_guard(int device) : device_(device) {
        check_cuda(cudaGetDevice(&saved_), "cudaGetDevice");
        if (saved_ != device_) check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;
    ~device_guard() {
        if (saved_ != device_) (void)cudaSetDevice(saved_);
    }

private:
    int device_;
    int saved_ = 0;
};

/// An owned CUDA stream. The default is an ordinary (blocking) stream: it waits for work on
/// the legacy default stream, so kernels a program launches there are ordered before the
/// collectives that read their output.
class stream {
public:
    explicit stream(unsigned flags = cudaStreamDefault) {
        check_cuda(cudaStreamCreateWithFlags(&s_, flags), "cudaStreamCreateWithFlags");
    }
    stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    stream& operator=(stream&& o) noexcept {
        if (this != &o) {
            reset();
            s_ = std::exchange(o.s_, nullptr);
        }
        return *this;
    }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    ~stream() { reset(); }

    cudaStream_t get() const noexcept { return s_; }
    operator cudaStream_t() const noexcept { return s_; }

private:
    void reset() noexcept {
        if (s_ != nullptr) (void)cudaStreamDestroy(s_);
        s_ = nullptr;
    }
    cudaStream_t s_ = nullptr;
};

/// An owned CUDA event without timing (the cheap kind, for completion only).
class event {
public:
    event() {
        check_cuda(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags");
    }
    event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    event& operator=(event&& o) noexcept {
        if (this != &o) {
            reset();
            e_ = std::exchange(o.e_, nullptr);
        }
        return *this;
    }
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    ~event() { reset(); }

    /// Records the event after everything enqueued on `s` so far.
    void record(cudaStream_t s) { check_cuda(cudaEventRecord(e_, s), "cudaEventRecord"); }
    cudaEvent_t get() const noexcept { return e_; }
    operator cudaEvent_t() const noexcept { return e_; }

private:
    void reset() noexcept {
        if (e_ != nullptr) (void)cudaEventDestroy(e_);
        e_ = nullptr;
    }
    cudaEvent_t e_ = nullptr;
};

/// Events kept for reuse (creating one costs a driver call): `take` one, `give` it back once
/// the work it marked has finished.
class event_pool {
public:
    event_pool() = default;
    event_pool(const event_pool&) = delete;
    event_pool& operator=(const event_pool&) = delete;
    ~event_pool() {
        for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
    }
    cudaEvent_t take() {
        if (!free_.empty()) {
            cudaEvent_t e = free_.back();
            free_.pop_back();
            return e;
        }
        cudaEvent_t e = nullptr;
        check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags");
        return e;
    }
    void give(cudaEvent_t e) noexcept {
        try {
            free_.push_back(e);
        } catch (...) {
            (void)cudaEventDestroy(e);
        }
    }

private:
    std::vector<cudaEvent_t> free_;
};

/// A view of `count` elements of device memory: what the GPU layer's operations take, like a
/// `std::span` whose pointer the host must not dereference.
template <class T>
struct device_span {
    using value_type = std::remove_cv_t<T>;
    static constexpr bool on_device = true;

    T* ptr = nullptr;
    std::size_t count = 0;

    T* data() const noexcept { return ptr; }
    std::size_t size() const noexcept { return count; }
    std::size_t size_bytes() const noexcept { return count * sizeof(T); }
    /// Elements [offset, offset + n).
    device_span subspan(std::size_t offset, std::size_t n) const noexcept {
        return {ptr + offset, n};
    }
};

/// `count` elements of device memory on the current device (cudaMalloc), freed on
/// destruction. Converts to `device_span`.
template <class T>
class device_buffer {
public:
    using value_type = T;
    static constexpr bool on_device = true;

    device_buffer() = default;
    explicit device_buffer(std::size_t count) : count_(count) {
        static_assert(std::is_trivially_copyable_v<T>, "corocoll: device elements are bytes");
        if (count > 0) {
            check_cuda(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)),
                       ("cudaMalloc of " + std::to_string(count * sizeof(T)) + " bytes").c_str());
        }
    }
    device_buffer(device_buffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    ~device_buffer() { reset(); }

    T* data() const noexcept { return ptr_; }
    std::size_t size() const noexcept { return count_; }
    std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
    device_span<T> span() const noexcept { return {ptr_, count_}; }
    operator device_span<T>() const noexcept { return span(); }
    operator device_span<const T>() const noexcept { return {ptr_, count_}; }

    /// Copies `host` (exactly size() elements) in, synchronously.
    void copy_from(std::span<const T> host) {
        check_size(host.size(), "copy_from");
        check_cuda(cudaMemcpy(ptr_, host.data(), size_bytes(), cudaMemcpyHostToDevice),
                   "cudaMemcpy to the device");
    }
    /// Copies the contents out into `host` (exactly size() elements), synchronously.
    void copy_to(std::span<T> host) const {
        check_size(host.size(), "copy_to");
        check_cuda(cudaMemcpy(host.data(), ptr_, size_bytes(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy from the device");
    }

private:
    void check_size(std::size_t n, const char* what) const {
        if (n != count_) {
            throw std::invalid_argument("corocoll: device_buffer::" + std::string(what) + ": " +
                                        std::to_string(n) + " host elements for " +
                                        std::to_string(count_) + " device elements");
        }
    }
    void reset() noexcept {
        if (ptr_ != nullptr) (void)cudaFree(ptr_);
        ptr_ = nullptr;
        count_ = 0;
    }
    T* ptr_ = nullptr;
    std::size_t count_ = 0;
};

/// What the GPU layer's operations accept: `device_span` and `device_buffer` (anything that
/// says `on_device` and has data() and size()).
template <class R>
concept device_memory = std::remove_cvref_t<R>::on_device && requires(const R& r) {
    r.data();
    r.size();
};

template <device_memory R>
using element_t =
    std::remove_cv_t<std::remove_pointer_t<decltype(std::declval<const R&>().data())>>;

/// Page-locked host memory (cudaMallocHost), the staging area of copies that must not block:
/// a copy from pageable memory is synchronous. Grows, never shrinks.
class pinned_buffer {
public:
    pinned_buffer() = default;
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;
    ~pinned_buffer() {
        if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    }
    /// At least `bytes` bytes (earlier contents are not kept when it grows).
    std::byte* reserve(std::size_t bytes) {
        if (bytes > size_) {
            if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
            ptr_ = nullptr;
            size_ = 0;
            check_cuda(cudaMallocHost(reinterpret_cast<void**>(&ptr_), bytes),
                       ("cudaMallocHost of " + std::to_string(bytes) + " bytes").c_str());
            size_ = bytes;
        }
        return ptr_;
    }
    std::byte* data() const noexcept { return ptr_; }
    std::size_t size() const noexcept { return size_; }

private:
    std::byte* ptr_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace gpu

COROCOLL_END_NAMESPACE
