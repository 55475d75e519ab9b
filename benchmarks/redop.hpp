// The reduction ops' names as the benchmarks take them (-o, nccl-tests' names) and corocoll's
// reduce_op for each: shared by coll_perf and gpu_coll_perf. It needs corocoll, so it is not
// in benchmarks/common/, which is standard library only.

#pragma once

#include <corocoll/corocoll.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace perf {

/// nccl-tests' names of the reduction ops corocoll has: sum, prod, min, max, avg.
inline const std::vector<std::string>& redop_names() {
    static const std::vector<std::string> names{"sum", "prod", "min", "max", "avg"};
    return names;
}

/// The reduce_op named `name` (one of redop_names()); throws std::invalid_argument otherwise.
inline corocoll::reduce_op redop_of(const std::string& name) {
    using op = corocoll::reduce_op;
    const op ops[] = {op::sum, op::product, op::min, op::max, op::avg};
    const auto& names = redop_names();
    for (std::size_t k = 0; k < names.size(); ++k) {
        if (name == names[k]) return ops[k];
    }
    throw std::invalid_argument("-o " + name + ": not a reduction the benchmarks know");
}

}  // namespace perf
