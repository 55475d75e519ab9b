#pragma once

/// Everything corocoll offers a CPU-only program. GPU support lives under its own include root
/// and is never pulled in from here.

#include <corocoll/version.hpp>

#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/cache_sizes.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/offload.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/thread_pool.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/core/work.hpp>

#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/futex.hpp>
#include <corocoll/io/membarrier.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/reactor_types.hpp>
#include <corocoll/io/socket.hpp>

#include <corocoll/rendezvous/file_store.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>

#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/peer.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/transport/tcp/mesh.hpp>

#include <corocoll/process_group/buffer.hpp>
#include <corocoll/process_group/default_group.hpp>
#include <corocoll/process_group/environment.hpp>
#include <corocoll/process_group/init.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/process_group/run.hpp>
#include <corocoll/process_group/spawn.hpp>
