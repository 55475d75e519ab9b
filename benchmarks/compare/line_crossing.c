// How far apart two processors are right now: two threads, pinned to the first two CPUs this
// process may run on, hand one cache line back and forth, and the time of one crossing (half a
// round trip) is printed as one JSON line:
//
//   {"one_way_ns": <cheapest batch>, "median_ns": <median batch>, "cpus": [a, b]}
//
// run_compare.py runs it before and after each system's run: on a virtual machine whose
// processors are placed nearer or farther apart for minutes at a time (a 2-vCPU AMD EPYC:
// 75-90 ns for a while, 300-340 ns for another), two systems compared minutes apart may have
// seen different machines, and this says so. With fewer than two CPUs it prints
// {"one_way_ns": null} and exits 0.
//
//   line_crossing [batches [round trips per batch]]   (default 15 batches of 2000)

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(64) _Atomic uint64_t line;
static long round_trips = 2000;
static int batches = 15;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// The far side: answers every odd value with the next even one.
static void* answer(void* arg) {
    pin(*(int*)arg);
    long total = (long)batches * round_trips;
    for (long i = 0; i < total; ++i) {
        uint64_t want = 2 * (uint64_t)i + 1;
        while (atomic_load_explicit(&line, memory_order_acquire) != want) {
        }
        atomic_store_explicit(&line, want + 1, memory_order_release);
    }
    return NULL;
}

static int by_value(const void* x, const void* y) {
    double a = *(const double*)x, b = *(const double*)y;
    return (a > b) - (a < b);
}

int main(int argc, char** argv) {
    if (argc > 1) batches = atoi(argv[1]);
    if (argc > 2) round_trips = atol(argv[2]);
    if (batches < 1 || batches > 1000 || round_trips < 1) {
        fprintf(stderr, "usage: line_crossing [batches (1-1000) [round trips per batch]]\n");
        return 2;
    }
    cpu_set_t allowed;
    int cpus[2], found = 0;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
        for (int c = 0; c < CPU_SETSIZE && found < 2; ++c) {
            if (CPU_ISSET(c, &allowed)) cpus[found++] = c;
        }
    }
    if (found < 2) {
        printf("{\"one_way_ns\": null}\n");
        return 0;
    }
    pthread_t far;
    if (pthread_create(&far, NULL, answer, &cpus[1]) != 0) {
        perror("line_crossing: pthread_create");
        return 1;
    }
    pin(cpus[0]);
    double ns[1000];
    uint64_t value = 0;
    for (int b = 0; b < batches; ++b) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < round_trips; ++i) {
            atomic_store_explicit(&line, ++value, memory_order_release);
            ++value;
            while (atomic_load_explicit(&line, memory_order_acquire) != value) {
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double took = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
        ns[b] = took / (2.0 * (double)round_trips);
    }
    pthread_join(far, NULL);
    qsort(ns, (size_t)batches, sizeof(ns[0]), by_value);
    printf("{\"one_way_ns\": %.1f, \"median_ns\": %.1f, \"cpus\": [%d, %d]}\n", ns[0],
           ns[batches / 2], cpus[0], cpus[1]);
    return 0;
}
