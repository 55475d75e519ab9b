// The data side of examples/ddp.cpp: an IDX reader for (Fashion-)MNIST files, plain or gzipped;
// a generated stand-in for when the files are absent; and the tutorial's DataPartitioner, with
// a shuffle that gives the same order on every machine.

#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#ifdef DDP_HAVE_ZLIB
#include <zlib.h>
#endif

namespace ddp {

/// Images of `rows` x `cols` unsigned-byte pixels, row-major, one after another, and a label
/// 0..9 for each.
struct dataset {
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::vector<std::uint8_t> pixels;
    std::vector<std::uint8_t> labels;

    std::size_t size() const noexcept { return labels.size(); }
    std::size_t pixels_per_image() const noexcept { return rows * cols; }
    const std::uint8_t* image(std::size_t i) const noexcept {
        return pixels.data() + i * pixels_per_image();
    }
};

/// The training and test sets, where they came from, and why not from the files if they were
/// generated (for the log).
struct data_sets {
    dataset train;
    dataset test;
    std::string origin;
    std::string note;
};

/// A 64-bit hash of `n` bytes, continuing from `h` (a multiply-rotate mix; not for security).
/// Cost: two multiplies per 8 bytes.
inline std::uint64_t hash_bytes(const void* bytes, std::size_t n, std::uint64_t h = 0) {
    auto mix = [&h](std::uint64_t w) {
        h ^= w * 0x9e3779b97f4a7c15ull;
        h = ((h << 31) | (h >> 33)) * 0xbf58476d1ce4e5b9ull;
    };
    const auto* p = static_cast<const unsigned char*>(bytes);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, p + i, 8);
        mix(w);
    }
    std::uint64_t tail = 0;
    if (i < n) std::memcpy(&tail, p + i, n - i);
    mix(tail ^ n);
    return h;
}

/// A hash of everything in `d`: equal on two ranks only if they loaded the same data.
inline std::uint64_t fingerprint(const data_sets& d) {
    std::uint64_t h = 0;
    for (const dataset* s : {&d.train, &d.test}) {
        std::uint64_t shape[] = {s->rows, s->cols, s->size()};
        h = hash_bytes(shape, sizeof shape, h);
        h = hash_bytes(s->pixels.data(), s->pixels.size(), h);
        h = hash_bytes(s->labels.data(), s->labels.size(), h);
    }
    return h;
}

/// splitmix64: turns one seed into independent ones (`stream` 1, 2, ...) for the separate uses
/// of randomness, so that changing how one of them draws does not shift the others.
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) noexcept {
    std::uint64_t z = seed + stream * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// A uniform integer in [0, bound) by rejection. `std::uniform_int_distribution` is not used:
/// its algorithm is left to the standard library, and every rank (and the single-process check)
/// must draw the same numbers whatever library it was built with. `std::mt19937_64` itself is
/// fully specified.
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
    // 2^64 mod bound values at the bottom would make small results likelier; skip them.
    const std::uint64_t reject_below = (0 - bound) % bound;
    for (;;) {
        std::uint64_t r = rng();
        if (r >= reject_below) return r % bound;
    }
}

/// A uniform float in [0, 1) from the top 24 bits of one draw (exact in float).
inline float uniform_unit(std::mt19937_64& rng) {
    return static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
}

// ---- IDX files ----

namespace detail {

/// Reads a file front to back; through zlib when its name ends in ".gz".
class byte_reader {
public:
    explicit byte_reader(std::string path) : path_(std::move(path)) {
        if (path_.ends_with(".gz")) {
#ifdef DDP_HAVE_ZLIB
            gz_ = gzopen(path_.c_str(), "rb");
            if (gz_ == nullptr) fail(std::string("cannot open it: ") + std::strerror(errno));
            gzbuffer(gz_, 1 << 17);
#else
            fail("it is gzip-compressed and this build has no zlib");
#endif
        } else {
            file_ = std::fopen(path_.c_str(), "rb");
            if (file_ == nullptr) fail(std::string("cannot open it: ") + std::strerror(errno));
        }
    }
    byte_reader(const byte_reader&) = delete;
    byte_reader& operator=(const byte_reader&) = delete;
    ~byte_reader() {
#ifdef DDP_HAVE_ZLIB
        if (gz_ != nullptr) gzclose(gz_);
#endif
        if (file_ != nullptr) std::fclose(file_);
    }

    const std::string& path() const noexcept { return path_; }

    /// Reads up to `n` bytes; fewer only at the end of the data. Throws on a read error.
    std::size_t read(void* into, std::size_t n) {
        auto* at = static_cast<unsigned char*>(into);
        std::size_t done = 0;
#ifdef DDP_HAVE_ZLIB
        if (gz_ != nullptr) {
            while (done < n) {
                // gzread takes an unsigned and returns an int.
                unsigned piece = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
                int got = gzread(gz_, at + done, piece);
                if (got < 0) gz_fail();
                if (got == 0) {
                    // The end of the data, or of a stream cut short (Z_BUF_ERROR).
                    int code = Z_OK;
                    gzerror(gz_, &code);
                    if (code != Z_OK) gz_fail();
                    break;
                }
                done += static_cast<std::size_t>(got);
            }
            return done;
        }
#endif
        done = std::fread(at, 1, n, file_);
        if (done < n && std::ferror(file_))
            fail(std::string("read error: ") + std::strerror(errno));
        return done;
    }

    [[noreturn]] void fail(const std::string& why) const {
        throw std::runtime_error(path_ + ": " + why);
    }

private:
#ifdef DDP_HAVE_ZLIB
    [[noreturn]] void gz_fail() const {
        int code = 0;
        std::string why = gzerror(gz_, &code);
        // zlib puts the path in front of its message; we do that already.
        if (why.starts_with(path_ + ": ")) why.erase(0, path_.size() + 2);
        fail("gzip: " + why);
    }
#endif

    std::string path_;
    std::FILE* file_ = nullptr;
#ifdef DDP_HAVE_ZLIB
    gzFile gz_ = nullptr;
#endif
};

inline std::uint32_t big_endian(const unsigned char* p) noexcept {
    return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 |
           std::uint32_t{p[3]};
}

// Far above MNIST's 70000 images, far below what would exhaust memory on a corrupt header.
inline constexpr std::uint32_t max_items = 10'000'000;

/// Reads an IDX header of unsigned bytes with `dims` dimensions, checking its magic number;
/// returns the dimensions.
inline std::vector<std::uint32_t> read_idx_header(byte_reader& in, unsigned dims,
                                                  const char* holds) {
    unsigned char head[4 + 4 * 3];
    std::size_t want = 4 + 4 * std::size_t{dims};
    std::size_t got = in.read(head, want);
    if (got < want) {
        in.fail("only " + std::to_string(got) + " bytes; an IDX header of " + holds + " has " +
                std::to_string(want));
    }
    std::uint32_t magic = big_endian(head);
    std::uint32_t expected = 0x0800u | dims;  // type 0x08 (unsigned byte), then the rank
    if (magic != expected) {
        char text[160];
        std::snprintf(text, sizeof text,
                      "magic number 0x%08x, expected 0x%08x (IDX, unsigned bytes, %u "
                      "dimension%s: %s)",
                      magic, expected, dims, dims == 1 ? "" : "s", holds);
        in.fail(text);
    }
    std::vector<std::uint32_t> sizes;
    for (unsigned d = 0; d < dims; ++d) sizes.push_back(big_endian(head + 4 + 4 * d));
    if (sizes[0] > max_items) {
        in.fail("header says " + std::to_string(sizes[0]) + " " + holds + ", more than the " +
                std::to_string(max_items) + " this reader accepts");
    }
    return sizes;
}

/// Reads exactly `into.size()` bytes of payload and checks that nothing follows.
inline void read_payload(byte_reader& in, std::span<std::uint8_t> into, const char* holds) {
    std::size_t got = in.read(into.data(), into.size());
    if (got < into.size()) {
        in.fail("ends after " + std::to_string(got) + " of the " + std::to_string(into.size()) +
                " bytes of " + holds + " that its header announces");
    }
    unsigned char extra = 0;
    if (in.read(&extra, 1) != 0) {
        in.fail("has more than the " + std::to_string(into.size()) + " bytes of " + holds +
                " that its header announces");
    }
}

}  // namespace detail

/// Reads an IDX file of images (magic 0x00000803: count, rows, cols, then the pixels) into
/// `out.pixels`. Throws `std::runtime_error` naming the file and what is wrong with it.
inline void read_idx_images(const std::string& path, dataset& out) {
    detail::byte_reader in(path);
    auto dims = detail::read_idx_header(in, 3, "images");
    if (dims[1] == 0 || dims[2] == 0 || dims[1] > 4096 || dims[2] > 4096) {
        in.fail("header says images of " + std::to_string(dims[1]) + " x " +
                std::to_string(dims[2]) + " pixels");
    }
    out.rows = dims[1];
    out.cols = dims[2];
    out.pixels.resize(std::size_t{dims[0]} * dims[1] * dims[2]);
    detail::read_payload(in, out.pixels, "pixels");
}

/// Reads an IDX file of labels (magic 0x00000801: count, then one byte each, 0..9 here) into
/// `out.labels`. Throws `std::runtime_error` naming the file and what is wrong with it.
inline void read_idx_labels(const std::string& path, dataset& out) {
    detail::byte_reader in(path);
    auto dims = detail::read_idx_header(in, 1, "labels");
    out.labels.resize(dims[0]);
    detail::read_payload(in, out.labels, "labels");
    for (std::size_t i = 0; i < out.labels.size(); ++i) {
        if (out.labels[i] > 9) {
            in.fail("label " + std::to_string(out.labels[i]) + " at index " + std::to_string(i) +
                    " is outside 0..9");
        }
    }
}

/// Where `name` is in `dir`: "<name>.gz" if it exists (and this build reads gzip), else
/// "<name>" if that exists, else empty.
inline std::string find_idx_file(const std::string& dir, const std::string& name,
                                 bool& only_gzip_found) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path plain = fs::path(dir) / name;
    fs::path gz = fs::path(dir) / (name + ".gz");
#ifdef DDP_HAVE_ZLIB
    if (fs::exists(gz, ec)) return gz.string();
#endif
    if (fs::exists(plain, ec)) return plain.string();
    if (fs::exists(gz, ec)) only_gzip_found = true;
    return {};
}

/// Reads the images and labels of one split and checks that they agree in count.
inline dataset read_split(const std::string& images_path, const std::string& labels_path) {
    dataset d;
    read_idx_images(images_path, d);
    read_idx_labels(labels_path, d);
    std::size_t images = d.pixels.size() / d.pixels_per_image();
    if (images != d.labels.size()) {
        throw std::runtime_error(images_path + " has " + std::to_string(images) + " images but " +
                                 labels_path + " has " + std::to_string(d.labels.size()) +
                                 " labels");
    }
    return d;
}

/// A stand-in for Fashion-MNIST, the same from one seed on every machine (`stream` tells the
/// splits apart): 10 class prototypes
/// of 28 x 28 pixels (about half of them dark, like the real images); each image is its class's
/// prototype blended with a random other class's, with a weight uniform in [0, 0.55), plus
/// uniform noise. Weights of 0.45 to 0.55 make images that could be either class, so no model
/// gets more than about 91% (1 - 0.5 x 0.1 / 0.55); an MLP gets close in one epoch. Cost: one
/// 64-bit draw per 4 pixels.
inline dataset generated_split(std::size_t count, std::uint64_t seed, std::uint64_t stream) {
    constexpr std::size_t side = 28, n = side * side, classes = 10;
    std::mt19937_64 rng(derive_seed(seed, 1));  // the prototypes: the same for every split
    std::vector<float> prototypes(classes * n);
    for (float& p : prototypes) {
        float u = uniform_unit(rng);
        p = u < 0.5f ? 0.0f : u;
    }
    dataset d;
    d.rows = side;
    d.cols = side;
    d.pixels.resize(count * n);
    d.labels.resize(count);
    rng.seed(derive_seed(seed, stream));
    for (std::size_t i = 0; i < count; ++i) {
        auto label = static_cast<std::size_t>(uniform_below(rng, classes));
        auto other =
            (label + 1 + static_cast<std::size_t>(uniform_below(rng, classes - 1))) % classes;
        float w = 0.55f * uniform_unit(rng);
        const float* a = &prototypes[label * n];
        const float* b = &prototypes[other * n];
        std::uint8_t* out = &d.pixels[i * n];
        for (std::size_t j = 0; j < n; j += 4) {
            std::uint64_t noise = rng();
            for (std::size_t k = 0; k < 4; ++k) {
                // 16 bits of the draw per pixel: noise uniform in [-0.4, 0.4).
                float e =
                    (static_cast<float>((noise >> (16 * k)) & 0xffff) / 65536.0f - 0.5f) * 0.8f;
                float v = (1 - w) * a[j + k] + w * b[j + k] + e;
                v = v < 0 ? 0 : (v > 1 ? 1 : v);
                out[j + k] = static_cast<std::uint8_t>(v * 255.0f + 0.5f);
            }
        }
        d.labels[i] = static_cast<std::uint8_t>(label);
    }
    return d;
}

/// Fashion-MNIST from `dir` (the files of Debian's dataset-fashion-mnist, gzipped or not), or,
/// when they are absent, the generated stand-in (then `note` says why). Throws when files are
/// there but malformed, or only some of them are there.
inline data_sets load_fashion_mnist(const std::string& dir, std::uint64_t seed) {
    const char* names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    std::string paths[4];
    int found = 0;
    bool only_gzip = false;
    for (int i = 0; i < 4; ++i) {
        paths[i] = find_idx_file(dir, names[i], only_gzip);
        found += paths[i].empty() ? 0 : 1;
    }
    data_sets sets;
    if (found == 0) {
        sets.note = only_gzip
                        ? "Fashion-MNIST in " + dir +
                              " is gzip-compressed and this build has no zlib; using a "
                              "generated data set"
                        : "Fashion-MNIST not found in " + dir + "; using a generated data set";
        sets.train = generated_split(60000, seed, 2);
        sets.test = generated_split(10000, seed, 3);
        sets.origin = "generated";
    } else {
        for (int i = 0; i < 4; ++i) {
            if (paths[i].empty()) {
                throw std::runtime_error(dir + " has some Fashion-MNIST files but not " + names[i] +
                                         (only_gzip ? " (or only gzipped, and this "
                                                      "build has no zlib)"
                                                    : "[.gz]"));
            }
        }
        sets.train = read_split(paths[0], paths[1]);
        sets.test = read_split(paths[2], paths[3]);
        if (sets.train.rows != sets.test.rows || sets.train.cols != sets.test.cols) {
            throw std::runtime_error(paths[0] + " and " + paths[2] +
                                     " hold images of different sizes");
        }
        sets.origin = "Fashion-MNIST from " + dir;
    }
    return sets;
}

// ---- partitioning ----

/// 0..n-1 in a random order drawn from `seed`: Fisher–Yates with `uniform_below`, so the order
/// is the same on every rank and every machine (`std::shuffle` is not: its use of the
/// generator is up to the library).
inline std::vector<std::uint32_t> shuffled_indices(std::size_t n, std::uint64_t seed) {
    std::vector<std::uint32_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
    std::mt19937_64 rng(seed);
    for (std::size_t i = n; i > 1; --i) {
        auto j = static_cast<std::size_t>(uniform_below(rng, i));
        std::swap(order[i - 1], order[j]);
    }
    return order;
}

/// The tutorial's DataPartitioner for one epoch: the training set shuffled (seed + epoch, as
/// DistributedSampler.set_epoch does), each rank an equal contiguous share cut into local
/// batches. The remainder of the data set that does not fill a local batch on every rank is
/// dropped, so every rank runs the same number of steps with batches of the same size.
class partition {
public:
    partition(std::size_t dataset_size, int world_size, std::size_t local_batch, std::uint64_t seed,
              int epoch)
        : partition(shuffled_indices(dataset_size, derive_seed(seed, 100 + std::uint64_t(epoch))),
                    world_size, local_batch) {}

    /// The samples of `order`, split over `world_size` ranks as above.
    partition(std::vector<std::uint32_t> order, int world_size, std::size_t local_batch)
        : order_(std::move(order)),
          local_batch_(local_batch),
          steps_(steps_for(order_.size(), world_size, local_batch)) {
        share_ = steps_ * local_batch_;
    }

    /// What this epoch still holds once `steps_done` steps of every one of `world_size` ranks
    /// are done: each rank's share from there on, rank after rank. A group that lost a rank
    /// splits it again over the survivors (`partition(left_after(...), survivors, ...)`), so
    /// the dead rank's samples are not lost to the epoch.
    std::vector<std::uint32_t> left_after(int world_size, std::size_t steps_done) const {
        std::vector<std::uint32_t> rest;
        for (int r = 0; r < world_size; ++r) {
            auto from =
                order_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * share_ +
                                                             steps_done * local_batch_);
            auto to = order_.begin() +
                      static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * share_);
            rest.insert(rest.end(), from, to);
        }
        return rest;
    }

    /// Steps (local batches per rank) in an epoch of a data set of `dataset_size`.
    static std::size_t steps_for(std::size_t dataset_size, int world_size,
                                 std::size_t local_batch) noexcept {
        return dataset_size / static_cast<std::size_t>(world_size) / local_batch;
    }

    /// Steps (local batches per rank) in the epoch.
    std::size_t steps() const noexcept { return steps_; }

    /// Rank `rank`'s indices into the data set at `step`.
    std::span<const std::uint32_t> batch(int rank, std::size_t step) const noexcept {
        return std::span(order_).subspan(
            static_cast<std::size_t>(rank) * share_ + step * local_batch_, local_batch_);
    }

private:
    std::vector<std::uint32_t> order_;
    std::size_t local_batch_;
    std::size_t steps_;
    std::size_t share_ = 0;
};

}  // namespace ddp
