#pragma once

// Kept only for tests/gpu/gpu_device_test.cpp, which still includes this path and names
// `pgtest::`: the helpers live in tests/support/ranks.hpp. Delete this file once that test
// includes "../support/ranks.hpp".

#include "../support/ranks.hpp"

namespace pgtest {

using corocoll_test::run_threads;
using corocoll_test::what;

}  // namespace pgtest
