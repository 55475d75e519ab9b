/* mpi_perf: coll_perf's measurements (benchmarks/coll_perf.cpp) made through MPI, so that
 * run_compare.py can set Open MPI and MPICH beside corocoll.
 *
 *   mpi_perf [--coll COLL] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]
 *
 *   --coll  ping_pong (one-way time = round trip / 2, between ranks 0 and 1), all_reduce (sum,
 *           in place), broadcast (root 0, in place), reduce (sum to root 0, in place there),
 *           all_gather (out of place), reduce_scatter (sum, out of place:
 *           MPI_Reduce_scatter_block), gather (to root 0), scatter (from root 0) or all_to_all
 *           (out of place: MPI_Alltoall)
 *   -b, -e, -f, -n, -w, -c  as coll_perf's; the type is float
 *
 * A size is coll_perf's (nccl-tests'): the buffer of ping_pong, all_reduce, broadcast and
 * reduce; the whole gathered buffer of all_gather and gather; the whole input of
 * reduce_scatter, scatter and all_to_all (each rank keeps size / n of reduce_scatter's and
 * scatter's, and sends size / n of all_to_all's to each rank).
 * Sizes, element counts, timing (barrier, warm-up, barrier, timed loop, mean per iteration, largest
 * over the ranks), checked values, busbw factors and the JSON rows on rank 0's stdout are
 * coll_perf's with -d float -o sum -F json, so that the runner can put the rows side by side.
 * (C, so it cannot share benchmarks/common/ with the C++ programs; it reads the same flags and
 * sizes.)
 *
 * Built once with mpicc.openmpi and once with mpicc.mpich.
 */

#include <mpi.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op {
    ping_pong,
    all_reduce,
    broadcast,
    reduce,
    all_gather,
    reduce_scatter,
    gather,
    scatter,
    all_to_all,
    op_count
};
static const char* const op_names[] = {"ping_pong", "all_reduce", "broadcast",
                                       "reduce",    "all_gather", "reduce_scatter",
                                       "gather",    "scatter",    "all_to_all"};

/* The ops whose size is split over the ranks (count elements per rank), as coll_perf's
 * elements() splits them. */
static int split(enum op op) {
    return op == all_gather || op == reduce_scatter || op == gather || op == scatter ||
           op == all_to_all;
}

/* The ops with a root (always rank 0). */
static int rooted(enum op op) {
    return op == broadcast || op == reduce || op == gather || op == scatter;
}

struct config {
    enum op op;
    size_t min_bytes;
    size_t max_bytes;
    double factor;
    int iters;
    int warmup;
    int check;
};

static void usage_error(const char* flag, const char* value, const char* why) {
    fprintf(stderr, "mpi_perf: %s %s: %s\n", flag, value, why);
    exit(2);
}

/* A size in bytes with an optional K, M or G suffix (powers of 1024, as coll_perf reads); a
 * fraction must come out a whole number of bytes (1.5M, not 1.3M). A decimal fraction times a
 * power of two is whole only if it is a multiple of a power of two's inverse, which a double
 * holds exactly, so the test below is exact. */
static size_t parse_size(const char* flag, const char* s) {
    char* end = NULL;
    double v = strtod(s, &end);
    if (end != s && end[0] != '\0' && end[1] == '\0') {
        char u = (char)toupper((unsigned char)end[0]);
        double mult = u == 'K' ? 1024.0 : u == 'M' ? 1048576.0 : u == 'G' ? 1073741824.0 : 0;
        if (mult != 0) {
            v *= mult;
            ++end;
        }
    }
    if (end == s || *end != '\0' || !(v >= 0) || strpbrk(s, "eExXpPnNiI") != NULL) {
        usage_error(flag, s, "expected a size in bytes (K, M, G allowed)");
    }
    if (v != (double)(size_t)v) usage_error(flag, s, "not a whole number of bytes");
    return (size_t)v;
}

static int parse_int(const char* flag, const char* s, int lo) {
    char* end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > 1000000000L) {
        usage_error(flag, s, "expected a whole number in range");
    }
    return (int)v;
}

static struct config parse(int argc, char** argv) {
    struct config c = {all_reduce, 32, (size_t)32 << 20, 2, 20, 5, 0};
    for (int i = 1; i < argc; i += 2) {
        const char* flag = argv[i];
        if (i + 1 >= argc) usage_error(flag, "", "needs a value");
        const char* v = argv[i + 1];
        if (strcmp(flag, "--coll") == 0) {
            int found = 0;
            for (int k = 0; k < op_count; ++k) {
                if (strcmp(v, op_names[k]) == 0) {
                    c.op = (enum op)k;
                    found = 1;
                }
            }
            if (!found) {
                usage_error(flag, v,
                            "expected ping_pong, all_reduce, broadcast, reduce, all_gather, "
                            "reduce_scatter, gather, scatter or all_to_all");
            }
        } else if (strcmp(flag, "-b") == 0) {
            c.min_bytes = parse_size(flag, v);
        } else if (strcmp(flag, "-e") == 0) {
            c.max_bytes = parse_size(flag, v);
        } else if (strcmp(flag, "-f") == 0) {
            c.factor = atof(v);
            if (!(c.factor > 1)) usage_error(flag, v, "must be above 1");
        } else if (strcmp(flag, "-n") == 0) {
            c.iters = parse_int(flag, v, 1);
        } else if (strcmp(flag, "-w") == 0) {
            c.warmup = parse_int(flag, v, 0);
        } else if (strcmp(flag, "-c") == 0) {
            c.check = parse_int(flag, v, 0) != 0;
        } else {
            usage_error(flag, v, "unknown option");
        }
    }
    if (c.min_bytes == 0) c.min_bytes = 1;
    if (c.max_bytes < c.min_bytes) usage_error("-e", "", "is below -b");
    return c;
}

/* What rank r holds at element i: small integers, so sums are exact (coll_perf's value()). */
static float value(int r, size_t i) { return (float)((i + (size_t)r) % 4 + 1); }

/* One op at one size: the buffers and the rank's place. */
struct bench {
    enum op op;
    int rank;
    int n;
    size_t count; /* elements per rank: the part each rank gives (all_gather), gets
                     (reduce_scatter) or exchanges with each rank (all_to_all) */
    float* a;     /* the input: count elements, count * n for reduce_scatter, scatter and
                     all_to_all */
    float* b;     /* the output of the out-of-place ops: count * n elements, count for
                     reduce_scatter and scatter */
};

/* Elements in the input and in the output of the out-of-place ops (0: there is none). */
static size_t input_count(const struct bench* x) {
    int whole = x->op == reduce_scatter || x->op == scatter || x->op == all_to_all;
    return x->count * (whole ? (size_t)x->n : 1);
}
static size_t output_count(const struct bench* x) {
    if (x->op == all_gather || x->op == gather || x->op == all_to_all) {
        return x->count * (size_t)x->n;
    }
    return x->op == reduce_scatter || x->op == scatter ? x->count : 0;
}

static void run_once(const struct bench* x) {
    int count = (int)x->count;
    switch (x->op) {
        case ping_pong:
            if (x->rank == 0) {
                MPI_Send(x->a, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(x->a, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (x->rank == 1) {
                MPI_Recv(x->a, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(x->a, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
            }
            break;
        case all_reduce:
            MPI_Allreduce(MPI_IN_PLACE, x->a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case broadcast:
            MPI_Bcast(x->a, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            break;
        case reduce:
            MPI_Reduce(x->rank == 0 ? MPI_IN_PLACE : x->a, x->a, count, MPI_FLOAT, MPI_SUM, 0,
                       MPI_COMM_WORLD);
            break;
        case all_gather:
            MPI_Allgather(x->a, count, MPI_FLOAT, x->b, count, MPI_FLOAT, MPI_COMM_WORLD);
            break;
        case gather:
            MPI_Gather(x->a, count, MPI_FLOAT, x->b, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            break;
        case scatter:
            MPI_Scatter(x->a, count, MPI_FLOAT, x->b, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            break;
        case reduce_scatter:
            MPI_Reduce_scatter_block(x->a, x->b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case all_to_all:
            MPI_Alltoall(x->a, count, MPI_FLOAT, x->b, count, MPI_FLOAT, MPI_COMM_WORLD);
            break;
        case op_count:
            break;
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Mean time per operation on this rank, in microseconds. */
static double time_op(const struct bench* x, const struct config* c) {
    MPI_Barrier(MPI_COMM_WORLD); /* as coll_perf: its connections open before the timed loop */
    for (int i = 0; i < c->warmup; ++i) run_once(x);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_us();
    for (int i = 0; i < c->iters; ++i) run_once(x);
    double per = (now_us() - t0) / c->iters;
    return x->op == ping_pong ? per / 2 : per;
}

/* What element i of rank r's input holds, as coll_perf fills it: rank 0's values only for
 * broadcast and ping_pong; for all_to_all, the part for rank d holds value(r + 2d, .), so that
 * sender and receiver both show. */
static float input(const struct bench* x, size_t i) {
    if (x->op == all_to_all) return value(x->rank + 2 * (int)(i / x->count), i % x->count);
    int gives = x->op != broadcast && x->op != ping_pong;
    return gives || x->rank == 0 ? value(x->rank, i) : 0;
}

static float sum_over_ranks(const struct bench* x, size_t i) {
    float sum = 0;
    for (int r = 0; r < x->n; ++r) sum += value(r, i);
    return sum;
}

/* What element j of the result must hold (rank 0's values for broadcast and ping_pong). */
static float expected(const struct bench* x, size_t j) {
    switch (x->op) {
        case all_reduce:
        case reduce:
            return sum_over_ranks(x, j);
        case reduce_scatter:
            return sum_over_ranks(x, (size_t)x->rank * x->count + j);
        case all_gather:
        case gather:
            return value((int)(j / x->count), j % x->count);
        case scatter:
            return value(0, (size_t)x->rank * x->count + j);
        case all_to_all:
            return value((int)(j / x->count) + 2 * x->rank, j % x->count);
        default:
            return value(0, j);
    }
}

/* Writes the inputs (coll_perf's values) and zeroes the outputs. Before the timed loop too, as
 * coll_perf does: a buffer fresh from calloc maps the kernel's shared zero page until it is
 * written, and a single copy (vader's process_vm_readv) of an unwritten root buffer then reads
 * one cached page over and over (a broadcast of 1 MiB took 30 µs that way, 2 ranks). */
static void fill(const struct bench* x) {
    for (size_t i = 0; i < input_count(x); ++i) x->a[i] = input(x, i);
    if (output_count(x) > 0) memset(x->b, 0, output_count(x) * sizeof(float));
}

/* Fills the buffers, runs once, and counts this rank's elements that are not what they must
 * be. */
static long long check_op(const struct bench* x) {
    fill(x);
    size_t total = output_count(x);
    float* result = x->b;
    if (total == 0) {
        total = x->count;
        result = x->a;
    }
    run_once(x);
    if (x->op == ping_pong && x->rank > 1) return 0; /* not part of it */
    if (x->op != broadcast && x->op != scatter && rooted(x->op) && x->rank != 0) return 0;
    long long wrong = 0;
    for (size_t j = 0; j < total; ++j) {
        if (result[j] != expected(x, j)) ++wrong;
    }
    return wrong;
}

/* nccl-tests' (benchmarks/common/bandwidth.hpp). */
static double bus_factor(enum op op, int n) {
    if (op == all_reduce) return 2.0 * (n - 1) / n;
    if (split(op)) return (double)(n - 1) / n;
    return 1;
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    struct config c = parse(argc, argv);
    int rank = 0;
    int n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (c.op == ping_pong && n < 2) {
        if (rank == 0) fprintf(stderr, "mpi_perf: ping_pong needs 2 ranks or more\n");
        MPI_Finalize();
        return 2;
    }
    long long wrong_total = 0;
    int rows = 0;
    if (rank == 0) printf("[\n");
    for (size_t bytes = c.min_bytes; bytes <= c.max_bytes;) {
        size_t next = (size_t)((double)bytes * c.factor);
        size_t count = bytes / sizeof(float) / (split(c.op) ? (size_t)n : 1);
        if (count > 0) {
            struct bench x = {c.op, rank, n, count, NULL, NULL};
            x.a = calloc(input_count(&x), sizeof(float));
            if (output_count(&x) > 0) x.b = calloc(output_count(&x), sizeof(float));
            /* The bytes actually moved, as coll_perf reports them. */
            size_t moved = count * sizeof(float) * (split(c.op) ? (size_t)n : 1);
            fill(&x);
            double mine = time_op(&x, &c);
            double time_us = 0;
            MPI_Allreduce(&mine, &time_us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            long long wrong = -1;
            if (c.check) {
                long long mine_wrong = check_op(&x);
                MPI_Allreduce(&mine_wrong, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
                wrong_total += wrong;
            }
            double algbw = time_us > 0 ? (double)moved / time_us / 1e3 : 0;
            if (rank == 0) {
                int reduces = c.op == all_reduce || c.op == reduce || c.op == reduce_scatter;
                int in_place = c.op == all_reduce || c.op == broadcast || c.op == reduce;
                printf(
                    "%s  {\"op\": \"%s\", \"ranks\": %d, \"size\": %zu, \"count\": %zu, "
                    "\"type\": \"float\", \"redop\": \"%s\", \"root\": %d, "
                    "\"placement\": \"%s\", \"time_us\": %.3f, \"algbw_gbs\": %.4f, "
                    "\"busbw_gbs\": %.4f, \"wrong\": %lld}",
                    rows > 0 ? ",\n" : "", op_names[c.op], n, moved, count,
                    reduces ? "sum" : "none", rooted(c.op) ? 0 : -1,
                    in_place ? "in-place" : "out-of-place", time_us, algbw,
                    algbw * bus_factor(c.op, n), wrong);
                fflush(stdout);
            }
            ++rows;
            free(x.a);
            free(x.b);
        }
        if (next <= bytes) break;
        bytes = next;
    }
    if (rank == 0) {
        printf("%s]\n", rows > 0 ? "\n" : "");
        fflush(stdout);
    }
    MPI_Finalize();
    return wrong_total > 0 ? 1 : 0;
}
