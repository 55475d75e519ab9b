/* mpi_startup: startup_probe's report (benchmarks/startup_probe.cpp) made through MPI, so that
 * many_ranks.py can set Open MPI and MPICH beside corocoll at 16-256 ranks.
 *
 *   mpirun -np N mpi_startup
 *
 * Each rank initialises MPI, makes one MPI_Allreduce of one float (sum), checks it and prints
 * "startup_done RANK NS" (NS: the wall clock, ns since the epoch, when it was done), then
 * "memory RANK RSS_KIB SHARED_KIB": its VmRSS and the shared file mappings it holds (what
 * /proc/self/maps shows mapped shared from a file: the transport's shared memory), counted the
 * same way as startup_probe's. Built once with mpicc.openmpi and once with mpicc.mpich.
 */

#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* VmRSS of this process, KiB (0 where /proc does not say). */
static long rss_kib(void) {
    FILE* f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    }
    fclose(f);
    return kib;
}

/* KiB mapped shared from a file (perms "rw-s" with a path; io_uring's and other anonymous
 * inodes left out). */
static long shared_kib(void) {
    FILE* f = fopen("/proc/self/maps", "r");
    char line[4096];
    long bytes = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[3] != 's') continue;
        if (strchr(line, '/') == NULL || strstr(line, "anon_inode:") != NULL) continue;
        bytes += (long)(hi - lo);
    }
    fclose(f);
    return bytes / 1024;
}

int main(int argc, char** argv) {
    int rank = 0, size = 0;
    float one = 1.0f, sum = 0.0f;
    struct timespec now;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    clock_gettime(CLOCK_REALTIME, &now);
    if (sum != (float)size) {
        fprintf(stderr, "mpi_startup: rank %d: all_reduce gave %g, not %d\n", rank, sum, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("startup_done %d %lld\n", rank, (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    printf("memory %d %ld %ld\n", rank, rss_kib(), shared_kib());
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
