#pragma once

// The GPU layer in one include: CUDA helpers, polled GPU waits, the NCCL backend and CUDA
// buffers staged over CPU groups. Needs CUDA and NCCL (the include-gpu root); CPU-only code
// includes <corocoll/corocoll.hpp> alone.

#include <corocoll/corocoll.hpp>
#include <corocoll/gpu/cuda.hpp>
#include <corocoll/gpu/nccl.hpp>
#include <corocoll/gpu/nccl_group.hpp>
#include <corocoll/gpu/staged.hpp>
#include <corocoll/gpu/wait.hpp>
