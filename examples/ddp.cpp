// The torch tutorial's "distributed synchronous SGD" ("Writing Distributed Applications with
// PyTorch") in C++, with what DistributedDataParallel does on top of the tutorial's
// `average_gradients`: the gradient is averaged in buckets whose all_reduce starts as soon as
// backward has filled them, while backward goes on computing the earlier layers.
//
// A 784-128-10 MLP learns Fashion-MNIST (Debian's dataset-fashion-mnist, or a generated stand-in
// when the files are absent). Every rank starts from the same parameters, trains on its own
// share of each global batch, and all ranks apply the same averaged gradient, so they stay
// identical. Each rank prints its mean training loss per epoch; rank 0 prints the test accuracy.
//
//   ddp [--nproc N] [--epochs E] [--batch B] [--lr LR] [--momentum M] [--seed S] [--data DIR]
//       [--max-steps N] [--min-accuracy X] [--check-single N] [--bucket-kib K]
//       [--kill-rank R --kill-at-step S [--lr-after-shrink kept|scaled]]
//
// --check-single N trains N steps, then rank 0 replays them in one process on the same global
// batches and fails if any parameter differs by more than rounding explains. Runs under any
// launcher (corocollrun, torchrun, mpirun), or spawns --nproc ranks itself.

#include "ddp_data.hpp"

#include <corocoll/corocoll.hpp>

#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cc = corocoll;

namespace {

using clock_type = std::chrono::steady_clock;

// ---- the model: 784-128-10, ReLU, softmax cross-entropy, float32 ----

constexpr std::size_t n_in = 28 * 28;
constexpr std::size_t n_hidden = 128;
constexpr std::size_t n_out = 10;

// Every parameter lives in one flat vector, and the gradient in another of the same layout, so
// that a bucket is a span of it. W1 is stored input-major, [n_in][n_hidden] (torch's weight
// transposed), so that both passes through it are loops over the 128 hidden units, which g++ -O2
// vectorises; W2 is [n_out][n_hidden], torch's layout, for the same reason.
constexpr std::size_t w1_at = 0;
constexpr std::size_t b1_at = w1_at + n_in * n_hidden;
constexpr std::size_t w2_at = b1_at + n_hidden;
constexpr std::size_t b2_at = w2_at + n_out * n_hidden;
constexpr std::size_t n_params = b2_at + n_out;

// y[j] += a * x[j] over the hidden units. Restrict pointers and a constant trip count that is a
// multiple of the vector width: what g++ 12's -O2 cost model ("very cheap": no alias check, no
// scalar epilogue) needs to vectorise the loop.
inline void axpy_hidden(float* __restrict y, const float* __restrict x, float a) {
    for (std::size_t j = 0; j < n_hidden; ++j) y[j] += a * x[j];
}

/// One copy of the model: parameters, gradient, momentum buffer and the activations of one
/// batch of at most `capacity` images, kept for the backward pass. The gradient is the mean
/// over the batch.
class replica {
public:
    replica(std::uint64_t seed, std::size_t capacity, float lr, float momentum)
        : params(n_params),
          grad(n_params),
          capacity_(capacity),
          lr_(lr),
          momentum_(momentum),
          velocity_(n_params),
          x_(capacity * n_in),
          h_(capacity * n_hidden),
          dh_(capacity * n_hidden),
          z_(capacity * n_out),
          dz_(capacity * n_out),
          labels_(capacity) {
        // torch.nn.Linear's default: weights and biases uniform in +-1/sqrt(fan_in), drawn
        // here from one seed, so every rank starts from the same parameters.
        std::mt19937_64 rng(seed);
        auto fill = [&](std::size_t from, std::size_t to, std::size_t fan_in) {
            float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
            for (std::size_t i = from; i < to; ++i) {
                params[i] = (2 * ddp::uniform_unit(rng) - 1) * bound;
            }
        };
        fill(w1_at, b1_at, n_in);
        fill(b1_at, w2_at, n_in);
        fill(w2_at, b2_at, n_hidden);
        fill(b2_at, n_params, n_hidden);
    }

    std::vector<float> params;
    std::vector<float> grad;
    /// The optimizer's state (momentum), which a rank that joins a smaller group takes over
    /// from its new rank 0 along with the parameters.
    std::vector<float>& velocity() noexcept { return velocity_; }

    /// Copies the images `indices` of `d` in as the batch, pixels scaled to [0, 1].
    void load_batch(const ddp::dataset& d, std::span<const std::uint32_t> indices) {
        if (indices.size() > capacity_) throw std::logic_error("batch larger than the workspace");
        batch_ = indices.size();
        for (std::size_t b = 0; b < batch_; ++b) {
            const std::uint8_t* img = d.image(indices[b]);
            float* x = &x_[b * n_in];
            for (std::size_t i = 0; i < n_in; ++i) x[i] = static_cast<float>(img[i]) / 255.0f;
            labels_[b] = d.labels[indices[b]];
        }
    }

    /// The forward pass: hidden activations and logits of the batch.
    void forward() {
        const float* w1 = &params[w1_at];
        const float* w2 = &params[w2_at];
        for (std::size_t b = 0; b < batch_; ++b) {
            const float* x = &x_[b * n_in];
            float* h = &h_[b * n_hidden];
            std::copy_n(&params[b1_at], n_hidden, h);
            for (std::size_t i = 0; i < n_in; ++i) {
                // About half of a Fashion-MNIST image is background; adding zeros changes
                // nothing, so skipping them does not change the result either.
                if (x[i] != 0.0f) axpy_hidden(h, w1 + i * n_hidden, x[i]);
            }
            for (std::size_t j = 0; j < n_hidden; ++j) h[j] = std::max(h[j], 0.0f);
            for (std::size_t k = 0; k < n_out; ++k) {
                float s = params[b2_at + k];
                for (std::size_t j = 0; j < n_hidden; ++j) s += w2[k * n_hidden + j] * h[j];
                z_[b * n_out + k] = s;
            }
        }
    }

    /// Mean softmax cross-entropy of the batch; leaves its gradient by the logits in dz.
    float loss_and_output_grad() {
        double total = 0;
        const float scale = 1.0f / static_cast<float>(batch_);
        for (std::size_t b = 0; b < batch_; ++b) {
            const float* z = &z_[b * n_out];
            float* dz = &dz_[b * n_out];
            float top = *std::max_element(z, z + n_out);
            float sum = 0;
            for (std::size_t k = 0; k < n_out; ++k) {
                dz[k] = std::exp(z[k] - top);
                sum += dz[k];
            }
            total += std::log(sum) - (z[labels_[b]] - top);
            for (std::size_t k = 0; k < n_out; ++k) {
                dz[k] = (dz[k] / sum - (k == labels_[b] ? 1.0f : 0.0f)) * scale;
            }
        }
        return static_cast<float>(total / static_cast<double>(batch_));
    }

    /// Backward through layer 2: the gradient of W2 and b2.
    void backward_output() {
        std::fill(grad.begin() + w2_at, grad.end(), 0.0f);
        for (std::size_t b = 0; b < batch_; ++b) {
            for (std::size_t k = 0; k < n_out; ++k) {
                float d = dz_[b * n_out + k];
                axpy_hidden(&grad[w2_at + k * n_hidden], &h_[b * n_hidden], d);
                grad[b2_at + k] += d;
            }
        }
    }

    /// Backward into the hidden layer: its gradient dh (through the ReLU) and b1's gradient.
    /// Reads W2, not its gradient, so it may run while layer 2's bucket is being reduced.
    void backward_hidden() {
        std::fill(grad.begin() + b1_at, grad.begin() + w2_at, 0.0f);
        for (std::size_t b = 0; b < batch_; ++b) {
            float* dh = &dh_[b * n_hidden];
            std::fill_n(dh, n_hidden, 0.0f);
            for (std::size_t k = 0; k < n_out; ++k) {
                axpy_hidden(dh, &params[w2_at + k * n_hidden], dz_[b * n_out + k]);
            }
            const float* h = &h_[b * n_hidden];
            for (std::size_t j = 0; j < n_hidden; ++j) dh[j] = h[j] > 0.0f ? dh[j] : 0.0f;
            axpy_hidden(&grad[b1_at], dh, 1.0f);
        }
    }

    /// The gradient of W1's rows [first, last) (one row per input pixel): touches nothing
    /// else, so the rows can be computed while other rows' buckets are being reduced.
    void backward_input(std::size_t first, std::size_t last) {
        std::fill(grad.begin() + w1_at + first * n_hidden, grad.begin() + w1_at + last * n_hidden,
                  0.0f);
        for (std::size_t b = 0; b < batch_; ++b) {
            const float* x = &x_[b * n_in];
            const float* dh = &dh_[b * n_hidden];
            for (std::size_t i = first; i < last; ++i) {
                if (x[i] != 0.0f) axpy_hidden(&grad[w1_at + i * n_hidden], dh, x[i]);
            }
        }
    }

    void set_lr(float lr) noexcept { lr_ = lr; }

    /// torch.optim.SGD with momentum (no dampening, no Nesterov, no weight decay):
    /// v = momentum * v + grad; params -= lr * v.
    void sgd_step() {
        for (std::size_t i = 0; i < n_params; ++i) {
            velocity_[i] = momentum_ * velocity_[i] + grad[i];
            params[i] -= lr_ * velocity_[i];
        }
    }

    /// How many images of the batch the model classifies right (after `forward`).
    std::size_t correct() const {
        std::size_t n = 0;
        for (std::size_t b = 0; b < batch_; ++b) {
            const float* z = &z_[b * n_out];
            n += static_cast<std::size_t>(std::max_element(z, z + n_out) - z) == labels_[b];
        }
        return n;
    }

private:
    std::size_t capacity_;
    std::size_t batch_ = 0;
    float lr_;
    float momentum_;
    std::vector<float> velocity_;
    std::vector<float> x_, h_, dh_, z_, dz_;
    std::vector<std::uint8_t> labels_;
};

/// One training step in a single process: what every rank's step together must amount to.
float single_process_step(replica& m) {
    m.forward();
    float loss = m.loss_and_output_grad();
    m.backward_output();
    m.backward_hidden();
    m.backward_input(0, n_in);
    m.sgd_step();
    return loss;
}

// ---- buckets ----

/// A span [begin, end) of the flat gradient that is averaged as one all_reduce, filled by the
/// gradient of W1's rows [first_row, last_row) (layer 1's buckets).
struct bucket {
    std::size_t begin;
    std::size_t end;
    std::size_t first_row;
    std::size_t last_row;
};

/// Layer 1's buckets in the order backward fills them (DDP too buckets parameters in reverse
/// order): W1 (392 KiB) cut into the fewest equal blocks of rows that each fit in `cap_bytes`,
/// from the last row down. b1 rides with the first of them, which it follows in memory; its
/// gradient is ready before any of W1's. Layer 2 (W2 and b2, 5 KiB) is one bucket before them.
std::vector<bucket> layer1_buckets(std::size_t cap_bytes) {
    const std::size_t row_bytes = n_hidden * sizeof(float);
    const std::size_t cap = std::max(cap_bytes, row_bytes);
    const std::size_t blocks = (n_in * row_bytes + cap - 1) / cap;
    const std::size_t rows = (n_in + blocks - 1) / blocks;
    std::vector<bucket> out;
    for (std::size_t last = n_in; last > 0;) {
        std::size_t first = last > rows ? last - rows : 0;
        std::size_t end = last == n_in ? w2_at : w1_at + last * n_hidden;
        out.push_back({w1_at + first * n_hidden, end, first, last});
        last = first;
    }
    return out;
}

// ---- distributed training ----

struct options {
    int nproc = 2;
    int epochs = 1;
    std::size_t batch = 64;
    float lr = 0.03f;
    float momentum = 0.9f;
    std::uint64_t seed = 1;
    std::string data = "/usr/share/datasets/fashion-mnist";
    std::size_t max_steps = std::numeric_limits<std::size_t>::max();
    double min_accuracy = -1;  // < 0: not checked
    std::size_t check_single = 0;
    std::size_t bucket_kib = 128;
    // A rank that kills itself (SIGKILL) before step `kill_at_step`; the others shrink the
    // group and finish the epochs without it.
    int kill_rank = -1;
    std::size_t kill_at_step = 0;
    // After a shrink the global batch shrinks with the group; "scaled" (the default) scales
    // the learning rate with it (the linear scaling rule), "kept" keeps it.
    bool scale_lr = true;
};

/// One step of synchronous data-parallel SGD on this rank's local batch (already loaded), as
/// DistributedDataParallel runs it. Backward goes from the last layer to the first; each
/// bucket's all_reduce starts as soon as backward has filled it and is driven by this thread's
/// reactor while the thread pool computes the next bucket's gradient. The step waits for every
/// bucket before the optimizer moves. Adds the time spent waiting to `waiting`.
///
/// Each rank's gradient is the mean over its local batch; their average over the ranks is the
/// mean over the global batch only because every local batch has the same size (the
/// partitioner drops what would make them unequal).
cc::task<float> train_step(cc::process_group& pg, replica& m, const std::vector<bucket>& buckets,
                           clock_type::duration& waiting) {
    // Nothing is in flight until the first bucket starts, so the forward pass and layer 2's
    // backward may hold the reactor's thread.
    m.forward();
    float loss = m.loss_and_output_grad();
    m.backward_output();

    std::vector<cc::work<>> in_flight;
    in_flight.reserve(buckets.size() + 1);
    std::span<float> layer2(m.grad.data() + w2_at, n_params - w2_at);
    in_flight.push_back(cc::start(pg.all_reduce(layer2, cc::reduce_op::avg)));

    // From here on the reactor's thread must stay free to move the buckets: the rest of
    // backward runs on the pool. (It cannot throw: no bucket is left running into a gradient
    // that an exception has freed.)
    co_await cc::offload([&] { m.backward_hidden(); });
    for (const bucket& b : buckets) {
        co_await cc::offload([&] { m.backward_input(b.first_row, b.last_row); });
        std::span<float> grads(m.grad.data() + b.begin, b.end - b.begin);
        in_flight.push_back(cc::start(pg.all_reduce(grads, cc::reduce_op::avg)));
    }

    // Every bucket, even after one failed (a peer died): the others write into m.grad until
    // they end, which they do at once then.
    auto wait_from = clock_type::now();
    std::exception_ptr failed;
    for (auto& w : in_flight) {
        try {
            co_await w;
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
    }
    if (failed) std::rethrow_exception(failed);
    waiting += clock_type::now() - wait_from;
    m.sgd_step();
    co_return loss;
}

/// Throws unless every rank passes the same `hash` (of `what`).
cc::task<> check_same_everywhere(cc::process_group& pg, std::uint64_t hash, const char* what) {
    // int64 on the wire: collectives take torch's dtypes, which have no uint64.
    std::array<std::int64_t, 1> mine{static_cast<std::int64_t>(hash)};
    std::vector<std::int64_t> all(static_cast<std::size_t>(pg.size()));
    co_await pg.all_gather_into(all, mine);
    for (std::size_t r = 1; r < all.size(); ++r) {
        if (all[r] != all[0]) {
            throw std::runtime_error("ranks 0 and " + std::to_string(r) + " hold different " +
                                     what);
        }
    }
}

/// The test set's accuracy, as (correct, total).
std::pair<std::size_t, std::size_t> evaluate(const std::vector<float>& params,
                                             const ddp::dataset& test) {
    constexpr std::size_t chunk = 500;
    replica m(0, chunk, 0, 0);
    m.params = params;
    std::vector<std::uint32_t> indices;
    std::size_t correct = 0;
    for (std::size_t from = 0; from < test.size(); from += chunk) {
        indices.clear();
        for (std::size_t i = from; i < std::min(from + chunk, test.size()); ++i) {
            indices.push_back(static_cast<std::uint32_t>(i));
        }
        m.load_batch(test, indices);
        m.forward();
        correct += m.correct();
    }
    return {correct, test.size()};
}

// The parameters after N steps of data-parallel training and of single-process training on the
// same global batches differ only by rounding: a rank sums its gradient over its local batch and
// divides by the local size, then the all_reduce adds the ranks' means and divides by the world
// size, where one process sums over the global batch and divides by its size. Each gradient
// element thus differs by a few float ulps, and SGD carries that into the parameters. Measured
// here (seeds 1-5, 2, 3 and 4 ranks): at most 4.5e-8 after 20 steps and 2.7e-7 after 100, on
// parameters of magnitude below 1 (so an absolute bound). The bound is 20 times the first and
// 4 times the second. Real mistakes are far above it: in the first step, the ranks' sum taken
// for their average moves parameters by 5e-4, and so does one example of the 64 swapped for
// another.
//
// Runs are kept to 100 steps because a longer one can differ for a legitimate reason: once an
// example's input to a hidden unit lands within rounding of zero, the ReLU passes the gradient
// in one run and not in the other, and that unit's weights jump by about 2e-6 (seen once in
// 1000 steps with 2 ranks, seed 1); momentum then carries the difference to 1e-5.
constexpr std::size_t max_parity_steps = 100;
constexpr double parity_tolerance = 1e-6;

/// With --check-single: trains a fresh replica in this process on the global batches of the
/// steps in `snapshots` (every rank's local batch of the step, in rank order) and compares its
/// parameters after each step with the data-parallel ones. Throws if any differ by more than
/// `parity_tolerance`.
void check_single_process(const options& o, const ddp::dataset& train, int world,
                          std::size_t local_batch,
                          const std::vector<std::vector<float>>& snapshots) {
    replica single(ddp::derive_seed(o.seed, 4), o.batch, o.lr, o.momentum);
    std::vector<std::uint32_t> global(o.batch);
    std::size_t step = 0;
    double worst = 0;
    for (int epoch = 0; step < snapshots.size(); ++epoch) {
        ddp::partition part(train.size(), world, local_batch, o.seed, epoch);
        for (std::size_t s = 0; s < part.steps() && step < snapshots.size(); ++s, ++step) {
            for (int r = 0; r < world; ++r) {
                auto local = part.batch(r, s);
                std::copy(local.begin(), local.end(),
                          global.begin() + static_cast<std::ptrdiff_t>(r * local_batch));
            }
            single.load_batch(train, global);
            single_process_step(single);
            double diff = 0;
            std::size_t at = 0;
            for (std::size_t i = 0; i < n_params; ++i) {
                double d = std::abs(double{single.params[i]} - double{snapshots[step][i]});
                if (d > diff) {
                    diff = d;
                    at = i;
                }
            }
            worst = std::max(worst, diff);
            std::printf("Rank 0, parity step %zu: max |ddp - single| = %.3g (parameter %zu)\n",
                        step, diff, at);
            if (!(diff <= parity_tolerance)) {
                char text[200];
                std::snprintf(text, sizeof text,
                              "parity: after step %zu parameter %zu is %.9g with %d ranks but "
                              "%.9g in one process (tolerance %g)",
                              step, at, double{snapshots[step][at]}, world,
                              double{single.params[at]}, parity_tolerance);
                throw std::runtime_error(text);
            }
        }
    }
    float largest = 0;
    for (float v : single.params) largest = std::max(largest, std::abs(v));
    std::printf(
        "Rank 0: %zu steps on %d ranks match one process on the same global batches "
        "(max |diff| %.3g, tolerance %.0e; max |parameter| %.3g)\n",
        snapshots.size(), world, worst, parity_tolerance, double{largest});
}

/// One rank's whole run: loading the data, training, the parity check, the test accuracy.
cc::task<> train(cc::process_group& first_group, const options& o) {
    // The group trained on: the first one, then (after a rank died) the survivors' group.
    cc::process_group* group = &first_group;
    std::shared_ptr<cc::process_group> survivors;
    cc::process_group& pg = first_group;
    int world = pg.size();
    int rank = pg.rank();
    const int first_rank = rank;
    // Every rank loads its own copy, as torch's ranks do, and as ranks on different machines
    // must.
    const ddp::data_sets data = ddp::load_fashion_mnist(o.data, ddp::derive_seed(o.seed, 5));
    if (data.train.pixels_per_image() != n_in || data.test.pixels_per_image() != n_in) {
        throw std::runtime_error(o.data + ": images of " + std::to_string(data.train.rows) + " x " +
                                 std::to_string(data.train.cols) +
                                 " pixels; the model takes 28 x 28");
    }
    // On several machines one may lack the files and fall back to generated data.
    co_await check_same_everywhere(pg, ddp::fingerprint(data), "data sets");
    if (o.batch % static_cast<std::size_t>(world) != 0) {
        throw std::invalid_argument("--batch " + std::to_string(o.batch) +
                                    " does not split evenly over " + std::to_string(world) +
                                    " ranks");
    }
    const std::size_t local_batch = o.batch / static_cast<std::size_t>(world);
    const std::size_t steps_per_epoch =
        ddp::partition::steps_for(data.train.size(), world, local_batch);
    if (o.check_single > steps_per_epoch * static_cast<std::size_t>(o.epochs)) {
        throw std::invalid_argument("--check-single " + std::to_string(o.check_single) +
                                    ": there are only " + std::to_string(steps_per_epoch) +
                                    " steps in an epoch; raise --epochs");
    }
    // Same seed on every rank: the same initial parameters, as DDP's broadcast from rank 0
    // would make them.
    replica m(ddp::derive_seed(o.seed, 4), local_batch, o.lr, o.momentum);
    const auto buckets = layer1_buckets(o.bucket_kib * 1024);
    if (rank == 0) {
        if (!data.note.empty()) std::printf("%s\n", data.note.c_str());
        std::printf("Rank 0: %s: %zu training and %zu test images\n", data.origin.c_str(),
                    data.train.size(), data.test.size());
        std::printf(
            "Rank 0: %d ranks, global batch %zu (%zu per rank), lr %g, momentum %g; "
            "gradient in %zu buckets: layer 2 (%zu B), then layer 1 in %zu of <= %zu B\n",
            world, o.batch, local_batch, double{o.lr}, double{o.momentum}, buckets.size() + 1,
            (n_params - w2_at) * sizeof(float), buckets.size(),
            (buckets.front().end - buckets.front().begin) * sizeof(float));
        std::fflush(stdout);
    }

    const bool snapshot = o.check_single > 0 && rank == 0;
    std::vector<std::vector<float>> snapshots;  // rank 0's parameters after each step
    std::size_t steps = 0;
    clock_type::duration waiting{};
    auto started = clock_type::now();
    for (int epoch = 0; epoch < o.epochs && steps < o.max_steps; ++epoch) {
        ddp::partition part(data.train.size(), world, local_batch, o.seed, epoch);
        double loss_sum = 0;
        std::size_t batches = 0;
        for (std::size_t s = 0; s < part.steps() && steps < o.max_steps; ++s) {
            if (first_rank == o.kill_rank && steps == o.kill_at_step) ::raise(SIGKILL);
            m.load_batch(data.train, part.batch(rank, s));
            float loss = 0;
            bool lost_a_rank = false;
            try {
                loss = co_await train_step(*group, m, buckets, waiting);
            } catch (const std::system_error&) {
                if (o.kill_rank < 0 || group->failed_ranks().empty()) throw;
                lost_a_rank = true;
            }
            if (lost_a_rank) {
                // A rank died during this step, which no survivor finished: shrink, take the
                // new rank 0's parameters and momentum (the same everywhere unless a rank had
                // stepped), and split what is left of the epoch, this step's samples included,
                // over the survivors. The global batch shrinks with the group.
                const int old_world = world;
                const std::string lost = std::to_string(group->failed_ranks().front());
                auto next = co_await group->shrink();
                co_await group->close();
                survivors = std::move(next);
                group = survivors.get();
                world = group->size();
                rank = group->rank();
                co_await group->broadcast(m.params, 0);
                co_await group->broadcast(m.velocity(), 0);
                part = ddp::partition(part.left_after(old_world, s), world, local_batch);
                if (o.scale_lr) {
                    m.set_lr(o.lr * static_cast<float>(world) /
                             static_cast<float>(first_group.size()));
                }
                s = std::numeric_limits<std::size_t>::max();  // the loop's ++s makes it 0
                if (rank == 0) {
                    std::printf(
                        "Rank 0 (rank %d before): rank %s died at step %zu; %d ranks "
                        "go on with %zu steps left in epoch %d\n",
                        first_rank, lost.c_str(), steps, world, part.steps(), epoch);
                    std::fflush(stdout);
                }
                continue;
            }
            loss_sum += loss;
            ++batches;
            ++steps;
            if (snapshot) snapshots.push_back(m.params);
        }
        std::printf("Rank %d, epoch %d: loss %.4f\n", rank, epoch,
                    batches > 0 ? loss_sum / static_cast<double>(batches) : 0.0);
        std::fflush(stdout);
    }
    std::chrono::duration<double> took = clock_type::now() - started;
    std::chrono::duration<double> waited = waiting;
    std::printf("Rank %d: %zu steps in %.2f s, %.2f s of it waiting for gradient buckets\n", rank,
                steps, took.count(), waited.count());
    std::fflush(stdout);

    // DDP's invariant: every rank holds the same parameters, bit for bit.
    co_await check_same_everywhere(
        *group, ddp::hash_bytes(m.params.data(), m.params.size() * sizeof(float)),
        "parameters after training");
    if (o.kill_rank >= 0 && o.kill_at_step < steps && world != first_group.size() - 1) {
        throw std::runtime_error("rank " + std::to_string(o.kill_rank) +
                                 " was to die, but the group still has " + std::to_string(world) +
                                 " ranks");
    }
    if (survivors) co_await survivors->close();

    if (rank != 0) co_return;
    if (o.check_single > 0) {
        check_single_process(o, data.train, world, local_batch, snapshots);
        // After the few steps of a check the test accuracy says nothing.
        if (o.min_accuracy < 0) co_return;
    }
    auto [correct, total] = evaluate(m.params, data.test);
    double accuracy = static_cast<double>(correct) / static_cast<double>(total);
    std::printf("Rank 0: test accuracy: %.2f%% (%zu/%zu)\n", 100 * accuracy, correct, total);
    std::fflush(stdout);
    if (accuracy < o.min_accuracy) {
        char text[96];
        std::snprintf(text, sizeof text, "test accuracy %.2f%% is below --min-accuracy %g%%",
                      100 * accuracy, 100 * o.min_accuracy);
        throw std::runtime_error(text);
    }
}

// ---- command line ----

const char* const usage =
    "usage: ddp [--nproc N] [--epochs E] [--batch B] [--lr LR] [--momentum M] [--seed S]\n"
    "           [--data DIR] [--max-steps N] [--min-accuracy X] [--check-single N]\n"
    "           [--bucket-kib K] [--kill-rank R --kill-at-step S [--lr-after-shrink kept|scaled]]\n"
    "  --nproc N         ranks to spawn when no launcher started us (default 2)\n"
    "  --epochs E        passes over the training set (default 1)\n"
    "  --batch B         global batch, split evenly over the ranks (default 64)\n"
    "  --lr LR           learning rate (default 0.03)\n"
    "  --momentum M      SGD momentum (default 0.9)\n"
    "  --seed S          seed of the initial parameters, the shuffle, generated data (default 1)\n"
    "  --data DIR        Fashion-MNIST IDX files, .gz or not\n"
    "                    (default /usr/share/datasets/fashion-mnist)\n"
    "  --max-steps N     stop after N steps\n"
    "  --min-accuracy X  exit non-zero if the test accuracy is below X (0..1)\n"
    "  --check-single N  train N <= 100 steps, then check them against one process\n"
    "  --bucket-kib K    cap of a gradient bucket (default 128)\n"
    "  --kill-rank R --kill-at-step S\n"
    "                    rank R kills itself (SIGKILL) before step S; the others shrink the\n"
    "                    group, take the rest of the epoch over between them, and go on\n"
    "  --lr-after-shrink kept|scaled\n"
    "                    the learning rate once the group (and the global batch with it) has\n"
    "                    shrunk: scaled with the global batch (default), or as it was\n";

bool parse_options(int argc, char** argv, options& o) {
    auto number = [](const char* flag, const char* text, double lo, double hi) {
        char* end = nullptr;
        double v = std::strtod(text, &end);
        if (end == text || *end != '\0' || !(v >= lo && v <= hi)) {
            char range[64];
            std::snprintf(range, sizeof range, "[%.15g, %.15g]", lo, hi);
            throw std::invalid_argument(std::string(flag) + ": '" + text + "' is not a number in " +
                                        range);
        }
        return v;
    };
    auto whole = [&](const char* flag, const char* text, double lo, double hi) {
        double v = number(flag, text, lo, hi);
        if (v != std::floor(v)) {
            throw std::invalid_argument(std::string(flag) + ": '" + text + "' is not an integer");
        }
        return v;
    };
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            std::fputs(usage, stdout);
            return false;
        }
        if (i + 1 >= argc) throw std::invalid_argument(flag + ": needs a value\n" + usage);
        const char* v = argv[++i];
        const char* f = flag.c_str();
        if (flag == "--nproc") {
            o.nproc = static_cast<int>(whole(f, v, 1, 1024));
        } else if (flag == "--epochs") {
            o.epochs = static_cast<int>(whole(f, v, 1, 1000));
        } else if (flag == "--batch") {
            o.batch = static_cast<std::size_t>(whole(f, v, 1, 60000));
        } else if (flag == "--lr") {
            o.lr = static_cast<float>(number(f, v, 0, 10));
        } else if (flag == "--momentum") {
            o.momentum = static_cast<float>(number(f, v, 0, 0.999));
        } else if (flag == "--seed") {
            o.seed = static_cast<std::uint64_t>(whole(f, v, 0, 9007199254740992.0));
        } else if (flag == "--data") {
            o.data = v;
        } else if (flag == "--max-steps") {
            o.max_steps = static_cast<std::size_t>(whole(f, v, 0, 1e12));
        } else if (flag == "--min-accuracy") {
            o.min_accuracy = number(f, v, 0, 1);
        } else if (flag == "--check-single") {
            // Rank 0 keeps the parameters of every step (400 KB each) until the check.
            o.check_single = static_cast<std::size_t>(whole(f, v, 1, max_parity_steps));
        } else if (flag == "--bucket-kib") {
            o.bucket_kib = static_cast<std::size_t>(whole(f, v, 1, 1 << 20));
        } else if (flag == "--kill-rank") {
            o.kill_rank = static_cast<int>(whole(f, v, 0, 1023));
        } else if (flag == "--kill-at-step") {
            o.kill_at_step = static_cast<std::size_t>(whole(f, v, 0, 1e12));
        } else if (flag == "--lr-after-shrink") {
            if (std::string(v) != "kept" && std::string(v) != "scaled") {
                throw std::invalid_argument("--lr-after-shrink: '" + std::string(v) +
                                            "' is neither kept nor scaled");
            }
            o.scale_lr = std::string(v) == "scaled";
        } else {
            throw std::invalid_argument("unknown flag " + flag + "\n" + usage);
        }
    }
    // The check replays exactly the steps that were trained.
    if (o.check_single > 0) o.max_steps = o.check_single;
    if (o.kill_rank >= 0 && o.check_single > 0) {
        throw std::invalid_argument("--kill-rank cannot go with --check-single");
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    try {
        if (!parse_options(argc, argv, o)) return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ddp: %s\n", e.what());
        return 2;
    }
    auto body = [&](cc::process_group& pg) -> cc::task<> { return train(pg, o); };
    if (o.kill_rank < 0 || cc::launched_by_launcher()) return cc::run_or_spawn(o.nproc, body);
    // The survivors must not be stopped when the killed rank ends; they succeed without it.
    cc::spawn_options keep_going;
    keep_going.stop_others_on_failure = false;
    auto result = cc::spawn_ranks(o.nproc, body, keep_going);
    int failed = 0;
    for (std::size_t r = 0; r < result.ranks.size(); ++r) {
        if (static_cast<int>(r) == o.kill_rank || result.ranks[r].ok()) continue;
        std::fprintf(stderr, "ddp: %s\n", result.ranks[r].describe().c_str());
        ++failed;
    }
    return failed == 0 ? 0 : 1;
}
