// Fuzz target for the frame header and the mesh hello checks (transport/frame.hpp,
// transport/tcp/mesh.hpp): an input is a run of 64-byte headers, as a reader or a listener takes
// them off a connection. Each header is checked as it came and again sealed with a valid
// checksum, so that the checks behind the checksum are reached too. What must hold:
//
// - `problem` is empty only for a header with the magic, the version, a checksum that matches
//   and a length within the limit;
// - `hello_problem` is empty only for a hello of this group and world size, from another rank
//   in range to this one, that agrees on the job token and announces exactly the bytes that
//   must follow;
// - an abort notice is read only from a goodbye and names a rank of the group.
//
// Built like the store targets (libFuzzer with clang, else standalone_driver.cpp).

#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/tcp/mesh.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tr = corocoll::transport;

namespace {

void check(bool ok) {
    if (!ok) __builtin_trap();
}

void check_header(const tr::frame_header& h) {
    constexpr std::uint64_t max_length = 4096;
    if (h.problem(max_length).empty()) {
        check(h.magic == tr::frame_magic && h.version == tr::protocol_version &&
              h.checksum == h.compute_checksum() && h.length <= max_length);
    }
    for (bool token : {false, true}) {
        tr::mesh_options o;
        o.group_name = "default";
        if (token) o.job_token = "fuzz";
        for (int size : {1, 2, 5}) {
            for (int rank = 0; rank < size; ++rank) {
                const std::size_t follows = corocoll::detail::nonce_bytes;
                for (int expected : {-1, (rank + 1) % size}) {
                    if (!tr::detail::hello_problem(h, rank, size, expected, o, follows).empty()) {
                        continue;
                    }
                    check(h.kind == tr::frame_kind::hello);
                    check(h.seq == tr::hash64("default"));
                    check(h.count == static_cast<std::uint64_t>(size));
                    check(h.dst == static_cast<std::uint32_t>(rank));
                    check(h.src < static_cast<std::uint32_t>(size) &&
                          h.src != static_cast<std::uint32_t>(rank));
                    check(expected < 0 || h.src == static_cast<std::uint32_t>(expected));
                    check((h.tag != 0) == token);
                    check(h.length == follows);
                }
            }
        }
    }
    for (int size : {1, 3}) {
        if (auto notice = tr::abort_notice::of(h, size)) {
            check(h.kind == tr::frame_kind::goodbye);
            check(notice->culprit < static_cast<std::uint32_t>(size));
            check(notice->text_length == h.length);  // read_text bounds what is read
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    for (std::size_t at = 0; at + sizeof(tr::frame_header) <= size;
         at += sizeof(tr::frame_header)) {
        tr::frame_header h;
        std::memcpy(&h, data + at, sizeof(h));
        check_header(h);
        h.seal();
        check_header(h);
    }
    return 0;
}
