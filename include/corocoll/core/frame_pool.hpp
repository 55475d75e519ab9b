#pragma once

// A per-thread pool of coroutine frames, so that a loop of the same awaits stops allocating.

#include <corocoll/version.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

// Under AddressSanitizer the pool stays out of the way, so that a frame used after it was
// freed is still reported.
#if defined(__SANITIZE_ADDRESS__)
#define COROCOLL_FRAME_POOL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COROCOLL_FRAME_POOL 0
#endif
#endif
#ifndef COROCOLL_FRAME_POOL
#define COROCOLL_FRAME_POOL 1
#endif

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// Recycles coroutine frames per thread, so that a program that awaits the same calls over
/// and over (a message loop, a training step) stops allocating once warm. Frames up to
/// `largest` bytes are kept in per-size free lists of this thread, at most `kept_per_size`
/// each; larger frames, and frames beyond that, go to `operator new`/`delete`. A frame freed
/// on another thread than the one that made it (a coroutine that moved to a thread pool) is
/// kept by the freeing thread: any thread may reuse any block.
class frame_pool {
public:
    static constexpr std::size_t granule = 64;
    static constexpr std::size_t largest = 4096;
    static constexpr std::size_t kept_per_size = 64;

    static void* allocate(std::size_t n) {
        ++made();
#if COROCOLL_FRAME_POOL
        if (n <= largest) {
            lists& l = mine();
            std::size_t k = size_class(n);
            if (block* b = l.head[k]) {
                l.head[k] = b->next;
                --l.count[k];
                return b;
            }
            return ::operator new(k* granule + granule);
        }
#endif
        return ::operator new(n);
    }

    static void deallocate(void* p, [[maybe_unused]] std::size_t n) noexcept {
#if COROCOLL_FRAME_POOL
        if (n <= largest) {
            lists& l = mine();
            std::size_t k = size_class(n);
            if (!l.closed && l.count[k] < kept_per_size) {
                auto* b = static_cast<block*>(p);
                b->next = l.head[k];
                l.head[k] = b;
                ++l.count[k];
                return;
            }
        }
#endif
        ::operator delete(p);
    }

    /// Frames this thread has made so far (from the pool or the heap): what benchmarks divide
    /// by a message count to say how many coroutine frames an operation costs.
    static std::uint64_t frames_made() noexcept { return made(); }

private:
    static std::uint64_t& made() noexcept;

    struct block {
        block* next;
    };
    static constexpr std::size_t classes = largest / granule;

    // Class k holds blocks of (k + 1) * granule bytes.
    static std::size_t size_class(std::size_t n) noexcept { return n == 0 ? 0 : (n - 1) / granule; }

    struct lists {
        block* head[classes] = {};
        std::size_t count[classes] = {};
        // Set while the thread exits: frames freed by later thread-local destructors go
        // straight back to the heap.
        bool closed = false;
        ~lists();
    };

    static lists& mine() noexcept;
};

/// Base of the library's promise types: their frames come from the frame pool.
struct pooled_frame {
    static void* operator new(std::size_t n) { return frame_pool::allocate(n); }
    static void operator delete(void* p, std::size_t n) noexcept { frame_pool::deallocate(p, n); }
};

}  // namespace detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/frame_pool.ipp>
#endif
