/*
 * prefork.c: the C twin of `shmsched demo`. A master creates two anonymous
 * regions (one Scheduler, one Limiter) and forks N workers, which share
 * one cap on concurrent "requests" with mixed priorities, and read a file
 * through one byte-rate budget. The master samples the global running
 * count while they run, can SIGKILL workers mid-request (--kill) and
 * replace them, and prints what each priority got.
 *
 * Build (from the repository, after `cargo build --release -p shmsched-ffi`):
 *     export PKG_CONFIG_PATH=$PWD/ffi/pkgconfig
 *     cc -O2 examples/c/prefork.c $(pkg-config --cflags --libs shmsched) -o prefork
 *     ./prefork --workers 8 --cap 4 --seconds 5 --kill 3
 *
 * Exits 0 when the cap held (no sample above it) and nothing leaked (after
 * the last worker exited and a final reap, the running count is 0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmsched.h"

#define MAX_WORKERS 256
#define CHUNK 65536

static void fail(const char *what, shmsched_status st) {
  char msg[1024];
  shmsched_last_error_message(msg, sizeof msg);
  fprintf(stderr, "prefork: %s: %s (%s)\n", what, shmsched_strerror(st), msg);
  exit(1);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* The demo's mix, in percent: highest 5, high 20, normal 40, low 25,
 * lowest 10. */
static int pick_priority(uint64_t *rng) {
  static const int prio[] = {SHMSCHED_PRIORITY_HIGHEST, SHMSCHED_PRIORITY_HIGH,
                             SHMSCHED_PRIORITY_NORMAL, SHMSCHED_PRIORITY_LOW,
                             SHMSCHED_PRIORITY_LOWEST};
  static const int pct[] = {5, 20, 40, 25, 10};
  int x = (int)(rng_next(rng) % 100);
  for (int i = 0; i < 5; i++) {
    if (x < pct[i]) return prio[i];
    x -= pct[i];
  }
  return SHMSCHED_PRIORITY_NORMAL;
}

struct options {
  int workers;
  uint32_t cap;
  double seconds;
  uint64_t rate;
  int kills;
  const char *file;
};

/* One worker: its own handles from the inherited regions (handles made by
 * the master belong to the master), then requests until the deadline.
 * Reports one line per priority on `report` (writes under PIPE_BUF are
 * atomic, so lines of several workers never interleave). */
static void worker(int id, shmsched_region *sched_region, shmsched_region *lim_region,
                   const struct options *o, uint64_t deadline, int report) {
  shmsched_scheduler *sched;
  shmsched_limiter *lim;
  shmsched_status st = shmsched_scheduler_attach(sched_region, &sched);
  if (st != SHMSCHED_STATUS_OK) fail("worker: attach scheduler", st);
  st = shmsched_limiter_attach(lim_region, &lim);
  if (st != SHMSCHED_STATUS_OK) fail("worker: attach limiter", st);
  uint64_t rng = ((uint64_t)getpid() << 32) ^ now_ns() ^ 0x9E3779B97F4A7C15ull;
  uint64_t tasks[7] = {0}, wait_ns[7] = {0}, bytes = 0;
  static char buf[CHUNK];
  while (now_ns() < deadline) {
    int p = pick_priority(&rng);
    uint64_t t0 = now_ns();
    shmsched_permit permit;
    st = shmsched_scheduler_acquire(sched, p, &permit);
    if (st != SHMSCHED_STATUS_OK) fail("worker: acquire", st);
    wait_ns[p + 3] += now_ns() - t0;
    /* The request: read up to 256 KiB of the file, every chunk charged to
     * the shared byte budget at the request's priority. */
    int fd = open(o->file, O_RDONLY);
    if (fd >= 0) {
      for (int k = 0; k < 4; k++) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        st = shmsched_limiter_consume(lim, (uint64_t)n, p, NULL);
        if (st != SHMSCHED_STATUS_OK) fail("worker: consume", st);
        bytes += (uint64_t)n;
      }
      close(fd);
    }
    /* Some work while holding the slot (2-20 ms, as in `shmsched demo`). */
    struct timespec nap = {0, (long)(2000000 + rng_next(&rng) % 18000000)};
    nanosleep(&nap, NULL);
    st = shmsched_permit_release(permit);
    if (st != SHMSCHED_STATUS_OK) fail("worker: release", st);
    tasks[p + 3]++;
  }
  for (int i = 0; i < 7; i++) {
    char line[160];
    int len = snprintf(line, sizeof line, "%d %d %llu %llu %llu\n", id, i,
                       (unsigned long long)tasks[i], (unsigned long long)wait_ns[i],
                       (unsigned long long)(i == 0 ? bytes : 0));
    if (write(report, line, (size_t)len) != len) _exit(1);
  }
  shmsched_limiter_close(lim);
  shmsched_scheduler_close(sched);
  _exit(0);
}

static void usage(void) {
  fprintf(stderr,
          "usage: prefork [--workers N] [--cap K] [--seconds S] [--rate BYTES_PER_S] "
          "[--kill N] [--file PATH]\n");
  exit(2);
}

int main(int argc, char **argv) {
  struct options o = {8, 4, 5.0, 32000000, 0, "/proc/self/exe"};
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    if (strcmp(argv[i], "--workers") == 0) o.workers = atoi(argv[++i]);
    else if (strcmp(argv[i], "--cap") == 0) o.cap = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--seconds") == 0) o.seconds = atof(argv[++i]);
    else if (strcmp(argv[i], "--rate") == 0) o.rate = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--kill") == 0) o.kills = atoi(argv[++i]);
    else if (strcmp(argv[i], "--file") == 0) o.file = argv[++i];
    else usage();
  }
  if (o.workers < 1 || o.workers > MAX_WORKERS || o.cap < 1 || o.seconds <= 0 || o.kills < 0)
    usage();
  if (shmsched_abi_version() != SHMSCHED_ABI_VERSION) {
    fprintf(stderr, "prefork: libshmsched has ABI %u, this program was built for %u\n",
            shmsched_abi_version(), SHMSCHED_ABI_VERSION);
    return 1;
  }

  /* The master makes the regions and initialises both objects before
   * forking; every worker inherits the region handles. */
  shmsched_region *sched_region, *lim_region;
  shmsched_scheduler *sched;
  shmsched_limiter *lim;
  shmsched_status st = shmsched_region_anonymous(0, &sched_region);
  if (st != SHMSCHED_STATUS_OK) fail("region", st);
  st = shmsched_region_anonymous(0, &lim_region);
  if (st != SHMSCHED_STATUS_OK) fail("region", st);
  st = shmsched_scheduler_shared(sched_region, o.cap, &sched);
  if (st != SHMSCHED_STATUS_OK) fail("scheduler", st);
  st = shmsched_limiter_shared(lim_region, o.rate, &lim);
  if (st != SHMSCHED_STATUS_OK) fail("limiter", st);

  int report[2];
  if (pipe(report) != 0) {
    perror("pipe");
    return 1;
  }
  uint64_t start = now_ns();
  uint64_t deadline = start + (uint64_t)(o.seconds * 1e9);
  pid_t pids[MAX_WORKERS];
  for (int i = 0; i < o.workers; i++) {
    fflush(stdout);
    pids[i] = fork();
    if (pids[i] == 0) {
      close(report[0]);
      worker(i, sched_region, lim_region, &o, deadline, report[1]);
    }
    if (pids[i] < 0) {
      perror("fork");
      return 1;
    }
  }

  /* Sample the global running count (every 100 us) until the deadline;
   * at --kill random instants, SIGKILL a random worker mid-request and
   * fork a replacement. */
  uint64_t rng = now_ns() | 1;
  uint64_t kill_at[64];
  int kills = o.kills > 64 ? 64 : o.kills, killed = 0;
  for (int k = 0; k < kills; k++) kill_at[k] = start + rng_next(&rng) % (deadline - start);
  uint32_t worst = 0;
  uint64_t samples = 0;
  while (now_ns() < deadline) {
    uint32_t running = 0;
    st = shmsched_scheduler_global_running(sched, &running);
    if (st != SHMSCHED_STATUS_OK) fail("global_running", st);
    if (running > worst) worst = running;
    samples++;
    for (int k = 0; k < kills; k++) {
      if (kill_at[k] != 0 && now_ns() >= kill_at[k]) {
        kill_at[k] = 0;
        int victim = (int)(rng_next(&rng) % (uint64_t)o.workers);
        kill(pids[victim], SIGKILL);
        waitpid(pids[victim], NULL, 0);
        killed++;
        fflush(stdout);
        pids[victim] = fork();
        if (pids[victim] == 0) {
          close(report[0]);
          worker(victim, sched_region, lim_region, &o, deadline, report[1]);
        }
      }
    }
    struct timespec nap = {0, 100000};
    nanosleep(&nap, NULL);
  }
  close(report[1]);
  for (int i = 0; i < o.workers; i++) waitpid(pids[i], NULL, 0);
  uint64_t elapsed = now_ns() - start;

  uint64_t tasks[7] = {0}, wait_ns[7] = {0}, bytes = 0;
  FILE *in = fdopen(report[0], "r");
  int id, pr;
  unsigned long long t, w, b;
  while (in && fscanf(in, "%d %d %llu %llu %llu", &id, &pr, &t, &w, &b) == 5) {
    if (pr >= 0 && pr < 7) {
      tasks[pr] += t;
      wait_ns[pr] += w;
      bytes += b;
    }
  }
  /* Dead workers' slots come back through the library's reaping; one last
   * reap, then nothing may be left. */
  uint32_t reaped = 0;
  uint64_t reclaimed = 0, total = 0;
  st = shmsched_scheduler_reap(sched, &reaped, &reclaimed);
  if (st != SHMSCHED_STATUS_OK) fail("reap", st);
  shmsched_scheduler_stats stats;
  stats.size = sizeof stats;
  st = shmsched_scheduler_get_stats(sched, &stats);
  if (st != SHMSCHED_STATUS_OK) fail("stats", st);

  static const char *names[] = {"lowest", "lower", "low", "normal", "high", "higher", "highest"};
  printf("prefork: %d workers, cap %u, %.1f s, %llu B/s budget, %d killed\n", o.workers, o.cap,
         (double)elapsed / 1e9, (unsigned long long)o.rate, killed);
  printf("%-8s %8s %14s\n", "priority", "tasks", "avg wait ms");
  for (int i = 6; i >= 0; i--) {
    if (tasks[i] == 0) continue;
    total += tasks[i];
    printf("%-8s %8llu %14.2f\n", names[i], (unsigned long long)tasks[i],
           (double)wait_ns[i] / (double)tasks[i] / 1e6);
  }
  printf("tasks %llu\n", (unsigned long long)total);
  printf("max running seen %u of cap %u (%llu samples)\n", worst, o.cap,
         (unsigned long long)samples);
  printf("bytes read %llu (%.1f%% of the budget over the run)\n", (unsigned long long)bytes,
         100.0 * (double)bytes / ((double)o.rate * (double)elapsed / 1e9));
  printf("reclaimed from dead workers %llu\n",
         (unsigned long long)(stats.has_region ? stats.region.reclaimed : 0));
  printf("leaked %u\n", stats.region.running);
  int ok = worst <= o.cap && stats.region.running == 0;
  printf("%s\n", ok ? "ok" : "FAILED");
  shmsched_limiter_close(lim);
  shmsched_scheduler_close(sched);
  shmsched_region_close(lim_region);
  shmsched_region_close(sched_region);
  return ok ? 0 : 1;
}
