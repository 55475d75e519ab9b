// The torch tutorial's collective examples ("Writing Distributed Applications with PyTorch"),
// with 4 ranks where rank r starts with [1 + 2r, 2 + 2r]. Run one by name:
//
//   collectives broadcast | scatter | gather | reduce | all_gather | all_reduce |
//               gather_object | group_all_reduce
//
// Each rank prints what it holds afterwards and checks it; the program exits non-zero if any
// rank holds something else. It runs under any launcher, or spawns its 4 ranks itself.

#include <corocoll/corocoll.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;

namespace {

using tensor = std::vector<float>;

std::string show(const tensor& t) {
    std::string s = "[";
    for (std::size_t i = 0; i < t.size(); ++i)
        s += (i ? ", " : "") + std::to_string(static_cast<int>(t[i]));
    return s + "]";
}

void expect(int rank, const tensor& got, const tensor& want, const char* what) {
    std::printf("Rank %d %s: %s\n", rank, what, show(got).c_str());
    if (got != want) throw std::runtime_error(std::string(what) + ": expected " + show(want));
}

tensor start_of(int r) { return {1.0f + 2 * r, 2.0f + 2 * r}; }

const std::map<std::string, std::function<cc::task<>(cc::process_group&)>> examples = {
    {"broadcast",
     [](cc::process_group& pg) -> cc::task<> {
         tensor t = start_of(pg.rank());
         co_await pg.broadcast(t, 0);
         expect(pg.rank(), t, {1, 2}, "has after broadcast from 0");
     }},
    {"scatter",
     [](cc::process_group& pg) -> cc::task<> {
         tensor t(2);
         std::vector<tensor> chunks;
         if (pg.rank() == 0) {
             for (int r = 0; r < pg.size(); ++r) chunks.push_back({float(r), float(r)});
         }
         co_await pg.scatter(t, chunks, 0);
         expect(pg.rank(), t, {float(pg.rank()), float(pg.rank())}, "got from scatter");
     }},
    {"gather",
     [](cc::process_group& pg) -> cc::task<> {
         tensor t = start_of(pg.rank());
         std::vector<tensor> all(pg.rank() == 0 ? pg.size() : 0, tensor(2));
         co_await pg.gather(t, all, 0);
         if (pg.rank() == 0) {
             for (int r = 0; r < pg.size(); ++r)
                 expect(0, all[r], start_of(r),
                        ("gathered from rank " + std::to_string(r)).c_str());
         }
     }},
    {"reduce",
     [](cc::process_group& pg) -> cc::task<> {
         tensor t = start_of(pg.rank());
         co_await pg.reduce(t, 3);
         expect(pg.rank(), t, pg.rank() == 3 ? tensor{16, 20} : start_of(pg.rank()),
                "has after reduce to 3");
     }},
    {"all_gather",
     [](cc::process_group& pg) -> cc::task<> {
         tensor t = start_of(pg.rank());
         std::vector<tensor> all(pg.size(), tensor(2));
         co_await pg.all_gather(all, t);
         for (int r = 0; r < pg.size(); ++r)
             expect(pg.rank(), all[r], start_of(r),
                    ("holds rank " + std::to_string(r) + "'s").c_str());
     }},
    {"all_reduce",
     [](cc::process_group& pg) -> cc::task<> {
         tensor t = start_of(pg.rank());
         co_await pg.all_reduce(t);
         expect(pg.rank(), t, {16, 20}, "has after all_reduce");
     }},
    {"gather_object",
     [](cc::process_group& pg) -> cc::task<> {
         std::string mine = "hello from rank " + std::to_string(pg.rank());
         std::vector<std::string> all;
         co_await pg.gather_object(mine, all, 0);
         if (pg.rank() == 0) {
             for (int r = 0; r < pg.size(); ++r) {
                 std::printf("Rank 0 received: %s\n", all[r].c_str());
                 if (all[r] != "hello from rank " + std::to_string(r))
                     throw std::runtime_error("wrong object");
             }
         }
     }},
    {"group_all_reduce",
     [](cc::process_group& pg) -> cc::task<> {
         std::vector<int> members{0, 1};
         auto group = co_await pg.new_group(members);
         tensor t = start_of(pg.rank());
         if (group) {
             co_await group->all_reduce(t);
             co_await group->close();
             expect(pg.rank(), t, {4, 6}, "has after all_reduce on group {0, 1}");
         } else {
             expect(pg.rank(), t, start_of(pg.rank()), "is not in group {0, 1} and keeps");
         }
     }},
};

}  // namespace

int main(int argc, char** argv) {
    std::string name = argc > 1 ? argv[1] : "all_reduce";
    auto it = examples.find(name);
    if (it == examples.end()) {
        std::fprintf(stderr, "unknown example '%s'\n", name.c_str());
        return 2;
    }
    return cc::run_or_spawn(4, it->second);
}
