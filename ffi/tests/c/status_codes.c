/*
 * Produces every status code of the C ABI from C, with the calls that
 * should produce it, and checks the conventions around them: the message
 * left for the thread, outputs left untouched on failure, the size
 * protocol of stats structs, truncation of messages.
 *
 * usage: status_codes PREFIX
 *   PREFIX is a path prefix for the region files this program creates
 *   (it removes them). Prints "produced <code> <function> <what>" for
 *   every status a check produced (<function> is the shmsched_ function
 *   the checked expression calls, or "-"), "FAIL ..." for every check that
 *   failed, and exits 0 only if no check failed. ffi/tests/status_codes.rs
 *   compares the produced codes with the header's enum, and each function's
 *   produced codes with the "Errors:" list of its doc comment.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmsched.h"

static int failures;
static char prefix[256];

static void fail(const char *what, const char *why) {
  printf("FAIL %s: %s\n", what, why);
  fflush(stdout);
  failures++;
}

/* Checks one call's status (and, on failure, that the thread's message
 * is non-empty and contains `fragment` when given). `call` is the checked
 * expression's text (see the expect macro below). */
static void expect_call(const char *call, const char *what, shmsched_status got,
                        shmsched_status want, const char *fragment) {
  char msg[2048];
  size_t n = shmsched_last_error_message(msg, sizeof msg);
  if (got != want) {
    char why[2300];
    snprintf(why, sizeof why, "got %u (%s), want %u (%s); message: %s", (unsigned)got,
             shmsched_strerror(got), (unsigned)want, shmsched_strerror(want),
             got == SHMSCHED_STATUS_OK ? "-" : msg);
    fail(what, why);
    return;
  }
  if (want != SHMSCHED_STATUS_OK) {
    if (n == 0) {
      fail(what, "empty error message");
      return;
    }
    if (fragment != NULL && strstr(msg, fragment) == NULL) {
      char why[2300];
      snprintf(why, sizeof why, "message lacks \"%s\": %s", fragment, msg);
      fail(what, why);
      return;
    }
  }
  /* The function the expression calls: "shmsched_x(...)" gives shmsched_x. */
  char fn[128] = "-";
  const char *open = strchr(call, '(');
  if (strncmp(call, "shmsched_", 9) == 0 && open != NULL && (size_t)(open - call) < sizeof fn) {
    memcpy(fn, call, (size_t)(open - call));
    fn[open - call] = 0;
  }
  printf("produced %u %s %s\n", (unsigned)got, fn, what);
  fflush(stdout);
}

#define expect(what, call, want, fragment) expect_call(#call, what, call, want, fragment)

static void check(int cond, const char *what) {
  if (!cond) {
    fail(what, "condition false");
  }
}

static const char *path(const char *tag) {
  static char buf[8][300];
  static int i;
  char *p = buf[i++ % 8];
  snprintf(p, 300, "%s-%s", prefix, tag);
  return p;
}

static shmsched_region *create_region(const char *tag, uint32_t slots) {
  shmsched_region *r = NULL;
  unlink(path(tag));
  expect("region_create", shmsched_region_create(path(tag), 0, slots, &r), SHMSCHED_STATUS_OK,
         NULL);
  return r;
}

static const char *fair_config =
    "{\"ceiling\":100,\"fairness_unit\":\"cost\","
    "\"tenants\":[{\"id\":\"a\",\"weight\":1},{\"id\":\"b\",\"weight\":1}],"
    "\"reclaim_horizon_ms\":100,\"idle_after_ms\":1000,\"started_at_ms\":0}";

/* Runs `body` in a forked child and counts its exit status as a check. */
static void in_child(const char *what, int (*body)(void *), void *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    fail(what, "fork failed");
    return;
  }
  if (pid == 0) {
    int bad = body(arg);
    fflush(stdout);
    _exit(bad ? 1 : 0);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fail(what, "the forked child's checks failed");
  }
}

struct fork_args {
  shmsched_region *region;
  shmsched_scheduler *sched;
  shmsched_permit permit;
};

/* In a child: the parent's scheduler handle and permit are not ours. */
static int child_uses_parent_handles(void *p) {
  struct fork_args *a = p;
  int before = failures;
  shmsched_permit q;
  expect("acquire on an inherited scheduler handle",
         shmsched_scheduler_acquire(a->sched, SHMSCHED_PRIORITY_NORMAL, &q),
         SHMSCHED_STATUS_FORKED, "after fork");
  expect("try_acquire on an inherited scheduler handle",
         shmsched_scheduler_try_acquire(a->sched, SHMSCHED_PRIORITY_NORMAL, &q),
         SHMSCHED_STATUS_FORKED, NULL);
  expect("release of the parent's permit in a child", shmsched_permit_release(a->permit),
         SHMSCHED_STATUS_FOREIGN_PERMIT, "belongs to process");
  /* The region works in the child: it can make its own scheduler. */
  shmsched_scheduler *mine = NULL;
  expect("attach in a forked child", shmsched_scheduler_attach(a->region, &mine),
         SHMSCHED_STATUS_OK, NULL);
  /* The parent holds the only slot: the child's own handle sees the same
   * budget, and gives up after its timeout. */
  shmsched_permit own;
  expect("acquire_timeout through the child's own handle",
         shmsched_scheduler_acquire_timeout(mine, SHMSCHED_PRIORITY_HIGH, 20000000, &own),
         SHMSCHED_STATUS_TIMEOUT, NULL);
  shmsched_scheduler_close(mine);
  shmsched_scheduler_close(a->sched); /* closing an inherited handle is allowed */
  return failures != before;
}

/* In a child: the region's single process slot is the parent's. */
static int child_finds_table_full(void *p) {
  struct fork_args *a = p;
  int before = failures;
  shmsched_scheduler *s = (shmsched_scheduler *)0x1;
  expect("bind with the process table full", shmsched_scheduler_attach(a->region, &s),
         SHMSCHED_STATUS_PROCESS_TABLE_FULL, "process table is full");
  check(s == (shmsched_scheduler *)0x1, "output untouched on PROCESS_TABLE_FULL");
  return failures != before;
}

static void regions(void) {
  shmsched_region *r = (shmsched_region *)0x1;
  expect("region_open(NULL name)", shmsched_region_open(NULL, &r), SHMSCHED_STATUS_NULL_ARGUMENT,
         "`name` is NULL");
  check(r == (shmsched_region *)0x1, "output untouched on NULL_ARGUMENT");
  expect("region_open(NULL out)", shmsched_region_open(path("x"), NULL),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`out` is NULL");
  expect("region_create world-writable",
         shmsched_region_create(path("ww"), 0666, 0, &r), SHMSCHED_STATUS_INVALID_ARGUMENT,
         "world-writable");
  expect("region_create 5000 process slots",
         shmsched_region_create(path("slots"), 0, 5000, &r), SHMSCHED_STATUS_INVALID_ARGUMENT,
         "process_slots 5000 out of range 1..=4096");
  check(r == (shmsched_region *)0x1, "output untouched on INVALID_ARGUMENT");
  expect("region_open missing", shmsched_region_open(path("missing"), &r),
         SHMSCHED_STATUS_NOT_FOUND, "No such file");
  expect("region_open a directory", shmsched_region_open("/dev/shm/", &r), SHMSCHED_STATUS_IO,
         "open /dev/shm/");
  expect("region_create in a missing directory",
         shmsched_region_create("/dev/shm/shmsched-no-such-dir/r", 0, 0, &r),
         SHMSCHED_STATUS_NOT_FOUND, "shmsched-no-such-dir");
  expect("region_open_or_create in a missing directory",
         shmsched_region_open_or_create("/dev/shm/shmsched-no-such-dir/r", 0, 0, &r),
         SHMSCHED_STATUS_NOT_FOUND, "shmsched-no-such-dir");
  {
    /* A world-writable region file is refused by open and open_or_create. */
    unlink(path("wwfile"));
    int fd = open(path("wwfile"), O_CREAT | O_EXCL | O_RDWR, 0600);
    check(fd >= 0 && fchmod(fd, 0666) == 0, "made a world-writable file");
    if (fd >= 0) close(fd);
    expect("region_open world-writable", shmsched_region_open(path("wwfile"), &r),
           SHMSCHED_STATUS_BAD_REGION, "world-writable");
    expect("region_open_or_create world-writable",
           shmsched_region_open_or_create(path("wwfile"), 0, 0, &r), SHMSCHED_STATUS_BAD_REGION,
           "world-writable");
    unlink(path("wwfile"));
  }
  const char bad_utf8[] = {'b', (char)0xff, 0};
  expect("region_open non-UTF-8 name", shmsched_region_open(bad_utf8, &r),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "not valid UTF-8");

  shmsched_region *a = create_region("exists", 0);
  expect("region_create existing", shmsched_region_create(path("exists"), 0, 0, &r),
         SHMSCHED_STATUS_ALREADY_EXISTS, "exists");
  shmsched_region_info info;
  info.size = sizeof info;
  expect("region_get_info empty", shmsched_region_get_info(a, &info), SHMSCHED_STATUS_OK, NULL);
  check(info.kind == SHMSCHED_KIND_NONE && info.size == sizeof info, "an empty region has no kind");
  shmsched_scheduler *s = NULL;
  expect("attach to an uninitialised region", shmsched_scheduler_attach(a, &s),
         SHMSCHED_STATUS_BAD_REGION, "not initialised");
  shmsched_region_close(a);
  expect("region_remove", shmsched_region_remove(path("exists")), SHMSCHED_STATUS_OK, NULL);
  expect("region_remove missing", shmsched_region_remove(path("exists")),
         SHMSCHED_STATUS_NOT_FOUND, NULL);

  /* A file that is not a region. */
  FILE *f = fopen(path("garbage"), "w");
  fputs("this is not a shmsched region, it is a text file that is long enough", f);
  fclose(f);
  expect("region_open garbage", shmsched_region_open(path("garbage"), &r), SHMSCHED_STATUS_OK,
         NULL);
  expect("attach to garbage", shmsched_scheduler_attach(r, &s), SHMSCHED_STATUS_BAD_REGION,
         "bad magic");
  shmsched_region_close(r);
  unlink(path("garbage"));

  /* A region written with another layout version. */
  shmsched_region *v = create_region("version", 0);
  expect("scheduler_shared", shmsched_scheduler_shared(v, 2, &s), SHMSCHED_STATUS_OK, NULL);
  shmsched_scheduler_close(s);
  shmsched_region_close(v);
  int fd = open(path("version"), O_RDWR);
  uint32_t other = SHMSCHED_LAYOUT_VERSION + 97;
  check(fd >= 0 && pwrite(fd, &other, sizeof other, 8) == (ssize_t)sizeof other,
        "patch the layout version");
  close(fd);
  expect("region_open another layout version", shmsched_region_open(path("version"), &r),
         SHMSCHED_STATUS_VERSION_MISMATCH, "layout version 99");
  unlink(path("version"));

  /* Wrong kind and other parameters. */
  shmsched_region *k = create_region("kind", 0);
  expect("scheduler_shared max 2", shmsched_scheduler_shared(k, 2, &s), SHMSCHED_STATUS_OK, NULL);
  shmsched_limiter *l = (shmsched_limiter *)0x1;
  expect("limiter on a scheduler region", shmsched_limiter_shared(k, 1000, &l),
         SHMSCHED_STATUS_WRONG_KIND, "holds a scheduler but a limiter was asked for");
  check(l == (shmsched_limiter *)0x1, "output untouched on WRONG_KIND");
  shmsched_scheduler *s3 = NULL;
  expect("scheduler_shared max 3 on a max-2 region", shmsched_scheduler_shared(k, 3, &s3),
         SHMSCHED_STATUS_MISMATCH, NULL);
  info.size = sizeof info;
  expect("region_get_info", shmsched_region_get_info(k, &info), SHMSCHED_STATUS_OK, NULL);
  check(info.kind == SHMSCHED_KIND_SCHEDULER && info.layout_version == SHMSCHED_LAYOUT_VERSION &&
            info.process_slots == 128,
        "region info of a scheduler region");
  shmsched_scheduler_close(s);
  shmsched_region_close(k);
  unlink(path("kind"));

  /* Descriptors: an anonymous region passes through dup_fd/open_fd. */
  shmsched_region *anon = NULL;
  expect("region_anonymous", shmsched_region_anonymous(0, &anon), SHMSCHED_STATUS_OK, NULL);
  expect("scheduler on the anonymous region", shmsched_scheduler_shared(anon, 5, &s),
         SHMSCHED_STATUS_OK, NULL);
  int dup = -1;
  expect("region_dup_fd", shmsched_region_dup_fd(anon, &dup), SHMSCHED_STATUS_OK, NULL);
  check(dup >= 0 && (fcntl(dup, F_GETFD) & FD_CLOEXEC) == 0, "dup_fd is inheritable by exec");
  shmsched_region *again = NULL;
  expect("region_open_fd", shmsched_region_open_fd(dup, &again), SHMSCHED_STATUS_OK, NULL);
  close(dup);
  shmsched_scheduler *s2 = NULL;
  uint32_t max = 0;
  expect("attach through the descriptor", shmsched_scheduler_attach(again, &s2),
         SHMSCHED_STATUS_OK, NULL);
  expect("concurrency", shmsched_scheduler_concurrency(s2, &max), SHMSCHED_STATUS_OK, NULL);
  check(max == 5, "the region behind the descriptor is the same");
  expect("region_open_fd(-1)", shmsched_region_open_fd(-1, &again),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "negative");
  int pipefd[2];
  check(pipe(pipefd) == 0, "pipe");
  expect("region_open_fd(pipe)", shmsched_region_open_fd(pipefd[0], &again),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "not a regular file");
  close(pipefd[0]);
  close(pipefd[1]);
  shmsched_region *named = create_region("named", 0);
  expect("region_dup_fd on a named region", shmsched_region_dup_fd(named, &dup),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "is named");
  shmsched_region_close(named);
  unlink(path("named"));
  shmsched_scheduler_close(s2);
  shmsched_scheduler_close(s);
  shmsched_region_close(again);
  shmsched_region_close(anon);

  /* A full process table: the parent holds the only slot. */
  shmsched_region *one = create_region("one", 1);
  expect("scheduler in a 1-slot region", shmsched_scheduler_shared(one, 2, &s),
         SHMSCHED_STATUS_OK, NULL);
  struct fork_args fa = {one, s, {0, 0}};
  in_child("process table full", child_finds_table_full, &fa);
  shmsched_scheduler_close(s);
  shmsched_region_close(one);
  unlink(path("one"));
}

static void schedulers(void) {
  shmsched_region *r = create_region("sched", 0);
  shmsched_scheduler *s = NULL;
  shmsched_permit p, q, sentinel = {0x5151, 0x5151};
  expect("scheduler_shared max 1", shmsched_scheduler_shared(r, 1, &s), SHMSCHED_STATUS_OK, NULL);
  shmsched_permit none = sentinel;
  expect("acquire(NULL handle)", shmsched_scheduler_acquire(NULL, 0, &none),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`sched` is NULL");
  expect("acquire priority 7", shmsched_scheduler_acquire(s, 7, &none),
         SHMSCHED_STATUS_INVALID_PRIORITY, "priority 7 is out of range: expected -3..=3");
  expect("acquire priority -4", shmsched_scheduler_acquire(s, -4, &none),
         SHMSCHED_STATUS_INVALID_PRIORITY, "-4");
  check(none.process == sentinel.process && none.serial == sentinel.serial,
        "permit untouched on failure");
  shmsched_concurrency c = shmsched_concurrency_max(4);
  expect("set_cap priority 9", shmsched_concurrency_set_cap(&c, 9, 1),
         SHMSCHED_STATUS_INVALID_PRIORITY, NULL);

  expect("acquire", shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_HIGH, &p), SHMSCHED_STATUS_OK,
         NULL);
  expect("try_acquire when full", shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_HIGHEST, &q),
         SHMSCHED_STATUS_WOULD_BLOCK, NULL);
  expect("acquire_timeout 1 ms when full",
         shmsched_scheduler_acquire_timeout(s, SHMSCHED_PRIORITY_NORMAL, 1000000, &q),
         SHMSCHED_STATUS_TIMEOUT, "timed out");
  uint32_t running = 0;
  expect("global_running", shmsched_scheduler_global_running(s, &running), SHMSCHED_STATUS_OK,
         NULL);
  check(running == 1, "the timed-out wait took nothing");

  struct fork_args fa = {r, s, p};
  in_child("inherited handles", child_uses_parent_handles, &fa);

  expect("release", shmsched_permit_release(p), SHMSCHED_STATUS_OK, NULL);
  expect("release twice", shmsched_permit_release(p), SHMSCHED_STATUS_ALREADY_RELEASED,
         "already released");
  shmsched_permit zero = {0, 0};
  expect("release of a zeroed permit", shmsched_permit_release(zero),
         SHMSCHED_STATUS_ALREADY_RELEASED, NULL);
  shmsched_permit forged = p;
  forged.process ^= (uint64_t)1 << 40;
  expect("release of another process's permit", shmsched_permit_release(forged),
         SHMSCHED_STATUS_FOREIGN_PERMIT, "only the process that acquired a permit can release it");
  expect("global_running", shmsched_scheduler_global_running(s, &running), SHMSCHED_STATUS_OK,
         NULL);
  check(running == 0, "one release freed one slot; the rejected ones freed nothing");

  /* Stats: the size protocol, and JSON with a too-small buffer. */
  expect("acquire", shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_LOW, &p), SHMSCHED_STATUS_OK,
         NULL);
  shmsched_scheduler_stats st;
  memset(&st, 0xAB, sizeof st);
  st.size = 8;
  expect("stats with size 8", shmsched_scheduler_get_stats(s, &st), SHMSCHED_STATUS_OK, NULL);
  check(st.size == 8 && st.concurrency == 1 && st.running == 0xABABABABABABABABull,
        "only the first 8 bytes were written");
  st.size = 4;
  expect("stats with size 4", shmsched_scheduler_get_stats(s, &st),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "out->size is 4");
  st.size = sizeof st;
  expect("stats", shmsched_scheduler_get_stats(s, &st), SHMSCHED_STATUS_OK, NULL);
  check(st.size == sizeof st && st.has_region == 1 && st.region.running == 1 &&
            st.region.max == 1 && st.region.processes == 1,
        "full stats of a shared scheduler");
  char small[4];
  size_t need = 0;
  expect("stats_json into 4 bytes", shmsched_scheduler_stats_json(s, small, sizeof small, &need),
         SHMSCHED_STATUS_BUFFER_TOO_SMALL, "buffer holds 4");
  check(need > 4, "the length needed is reported");
  size_t sized = 0;
  expect("stats_json size query (NULL, 0)", shmsched_scheduler_stats_json(s, NULL, 0, &sized),
         SHMSCHED_STATUS_OK, NULL);
  check(sized == need, "a size query (NULL, 0) gives the length without the NUL, as snprintf");
  expect("stats_json NULL buffer with a length",
         shmsched_scheduler_stats_json(s, NULL, 8, &sized), SHMSCHED_STATUS_NULL_ARGUMENT,
         "`buf` is NULL");
  char *big = malloc(need + 1);
  size_t len = 0;
  expect("stats_json", shmsched_scheduler_stats_json(s, big, need + 1, &len), SHMSCHED_STATUS_OK,
         NULL);
  check(len == need && strlen(big) == len && strstr(big, "\"running\":1") != NULL,
        "JSON stats fit exactly");
  free(big);
  expect("release", shmsched_permit_release(p), SHMSCHED_STATUS_OK, NULL);

  /* Disposed, zero concurrency. */
  expect("dispose", shmsched_scheduler_dispose(s), SHMSCHED_STATUS_OK, NULL);
  expect("acquire after dispose", shmsched_scheduler_acquire(s, 0, &q), SHMSCHED_STATUS_DISPOSED,
         "disposed");
  expect("try_acquire after dispose", shmsched_scheduler_try_acquire(s, 0, &q),
         SHMSCHED_STATUS_DISPOSED, NULL);
  bool disposed = false;
  expect("is_disposed", shmsched_scheduler_is_disposed(s, &disposed), SHMSCHED_STATUS_OK, NULL);
  check(disposed, "is_disposed says so");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  unlink(path("sched"));

  shmsched_region *z = create_region("zero", 0);
  expect("scheduler_shared max 0", shmsched_scheduler_shared(z, 0, &s), SHMSCHED_STATUS_OK, NULL);
  expect("acquire with max 0", shmsched_scheduler_acquire(s, 0, &q),
         SHMSCHED_STATUS_ZERO_CONCURRENCY, "concurrency is 0");
  expect("try_acquire with max 0", shmsched_scheduler_try_acquire(s, 0, &q),
         SHMSCHED_STATUS_ZERO_CONCURRENCY, NULL);
  shmsched_scheduler_close(s);
  shmsched_region_close(z);
  unlink(path("zero"));

  /* A permit outlives its closed handle; detach refuses while one is out. */
  shmsched_region *o = create_region("outlive", 0);
  expect("scheduler_shared", shmsched_scheduler_shared(o, 2, &s), SHMSCHED_STATUS_OK, NULL);
  expect("acquire", shmsched_scheduler_acquire(s, 0, &p), SHMSCHED_STATUS_OK, NULL);
  expect("detach with a permit out (closes the handle)", shmsched_scheduler_detach(s),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "holds 1 permit");
  expect("release after the handle closed", shmsched_permit_release(p), SHMSCHED_STATUS_OK, NULL);
  shmsched_region_close(o);
  unlink(path("outlive"));
}


/* The completion of an `_async` call, handed over to the waiting caller. */
struct done {
  pthread_mutex_t m;
  pthread_cond_t c;
  int fired;
  shmsched_status status;
  shmsched_permit permit;
  shmsched_grant grant;
  char message[512];
};

static void done_init(struct done *d) {
  memset(d, 0, sizeof *d);
  pthread_mutex_init(&d->m, NULL);
  pthread_cond_init(&d->c, NULL);
}

static void finish(struct done *d, shmsched_status st, const char *message) {
  pthread_mutex_lock(&d->m);
  d->status = st;
  snprintf(d->message, sizeof d->message, "%s", message ? message : "");
  d->fired++;
  pthread_cond_signal(&d->c);
  pthread_mutex_unlock(&d->m);
}

static void on_acquired(void *ctx, shmsched_status st, shmsched_permit p, const char *message) {
  struct done *d = ctx;
  d->permit = p;
  finish(d, st, message);
}

static void on_consumed(void *ctx, shmsched_status st, shmsched_grant g, const char *message) {
  struct done *d = ctx;
  d->grant = g;
  finish(d, st, message);
}

static void wait_done(struct done *d) {
  pthread_mutex_lock(&d->m);
  while (!d->fired) pthread_cond_wait(&d->c, &d->m);
  pthread_mutex_unlock(&d->m);
}

/* Async waits: the callback runs once, from a library thread. */
static void async_waits(void) {
  shmsched_region *r = create_region("async", 0);
  shmsched_scheduler *s = NULL;
  expect("scheduler_shared max 1", shmsched_scheduler_shared(r, 1, &s), SHMSCHED_STATUS_OK, NULL);
  shmsched_permit held;
  expect("acquire", shmsched_scheduler_acquire(s, 0, &held), SHMSCHED_STATUS_OK, NULL);
  struct done d;
  done_init(&d);
  expect("acquire_async with a NULL callback",
         shmsched_scheduler_acquire_async(s, 0, SHMSCHED_FOREVER, NULL, &d),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`callback` is NULL");
  expect("acquire_async priority 4",
         shmsched_scheduler_acquire_async(s, 4, SHMSCHED_FOREVER, on_acquired, &d),
         SHMSCHED_STATUS_INVALID_PRIORITY, NULL);
  expect("acquire_async 5 ms while full",
         shmsched_scheduler_acquire_async(s, 0, 5000000, on_acquired, &d), SHMSCHED_STATUS_OK,
         NULL);
  wait_done(&d);
  check(d.fired == 1 && d.status == SHMSCHED_STATUS_TIMEOUT && strstr(d.message, "timed out"),
        "an async wait times out through its callback, with the message");
  done_init(&d);
  expect("acquire_async forever", shmsched_scheduler_acquire_async(s, SHMSCHED_PRIORITY_HIGH,
                                                                   SHMSCHED_FOREVER, on_acquired, &d),
         SHMSCHED_STATUS_OK, NULL);
  expect("release (wakes the async waiter)", shmsched_permit_release(held), SHMSCHED_STATUS_OK,
         NULL);
  wait_done(&d);
  check(d.fired == 1 && d.status == SHMSCHED_STATUS_OK && d.message[0] == 0,
        "an async acquire is granted through its callback");
  expect("release the async permit on another thread", shmsched_permit_release(d.permit),
         SHMSCHED_STATUS_OK, NULL);
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  unlink(path("async"));

  shmsched_region *lr = create_region("async-lim", 0);
  shmsched_limiter *l = NULL;
  expect("limiter_shared", shmsched_limiter_shared(lr, 100000, &l), SHMSCHED_STATUS_OK, NULL);
  expect("consume the bucket", shmsched_limiter_consume(l, 100000, 0, NULL), SHMSCHED_STATUS_OK,
         NULL);
  done_init(&d);
  expect("consume_async", shmsched_limiter_consume_async(l, 1000, SHMSCHED_PRIORITY_LOW,
                                                         SHMSCHED_FOREVER, on_consumed, &d),
         SHMSCHED_STATUS_OK, NULL);
  wait_done(&d);
  check(d.fired == 1 && d.status == SHMSCHED_STATUS_OK && !d.grant.immediate,
        "an async consume waits for the refill");
  done_init(&d);
  expect("consume_async too much", shmsched_limiter_consume_async(l, 3000000000ull, 0,
                                                                  SHMSCHED_FOREVER, on_consumed, &d),
         SHMSCHED_STATUS_OK, NULL);
  wait_done(&d);
  check(d.status == SHMSCHED_STATUS_INVALID_ARGUMENT && strstr(d.message, "3000000000"),
        "a bad amount is reported through the callback");
  shmsched_limiter_close(l);
  shmsched_region_close(lr);
  unlink(path("async-lim"));
}

static void limiters(void) {
  shmsched_region *r = create_region("lim", 0);
  shmsched_limiter *l = NULL;
  expect("limiter rate 0", shmsched_limiter_shared(r, 0, &l), SHMSCHED_STATUS_INVALID_ARGUMENT,
         "tokens_per_second 0 is out of range");
  expect("limiter_shared", shmsched_limiter_shared(r, 1000, &l), SHMSCHED_STATUS_OK, NULL);
  shmsched_grant g = {false, false};
  expect("consume", shmsched_limiter_consume(l, 1000, SHMSCHED_PRIORITY_NORMAL, &g),
         SHMSCHED_STATUS_OK, NULL);
  check(g.immediate && !g.forced, "a full bucket charges at once");
  expect("consume priority 5", shmsched_limiter_consume(l, 1, 5, NULL),
         SHMSCHED_STATUS_INVALID_PRIORITY, NULL);
  expect("consume too much", shmsched_limiter_consume(l, 3000000000ull, 0, NULL),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "3000000000");
  expect("try_consume on an empty bucket", shmsched_limiter_try_consume(l, 500),
         SHMSCHED_STATUS_WOULD_BLOCK, NULL);
  expect("try_consume_at on an empty bucket",
         shmsched_limiter_try_consume_at(l, 500, SHMSCHED_PRIORITY_HIGH),
         SHMSCHED_STATUS_WOULD_BLOCK, NULL);
  expect("try_consume_at priority 5", shmsched_limiter_try_consume_at(l, 1, 5),
         SHMSCHED_STATUS_INVALID_PRIORITY, "priority 5 is out of range: expected -3..=3");
  expect("try_consume_at priority -4", shmsched_limiter_try_consume_at(l, 1, -4),
         SHMSCHED_STATUS_INVALID_PRIORITY, "priority -4 is out of range");
  expect("try_consume_at too much",
         shmsched_limiter_try_consume_at(l, 3000000000ull, SHMSCHED_PRIORITY_HIGH),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "3000000000");
  expect("try_consume_at NULL", shmsched_limiter_try_consume_at(NULL, 1, 0),
         SHMSCHED_STATUS_NULL_ARGUMENT, NULL);
  expect("consume_timeout on an empty bucket",
         shmsched_limiter_consume_timeout(l, 900, SHMSCHED_PRIORITY_LOW, 1000000, NULL),
         SHMSCHED_STATUS_TIMEOUT, NULL);
  shmsched_limiter_stats st;
  st.size = sizeof st;
  expect("limiter stats", shmsched_limiter_get_stats(l, &st), SHMSCHED_STATUS_OK, NULL);
  check(st.tokens_per_second == 1000 && st.has_region == 1 && st.region.processes == 1,
        "limiter stats");
  size_t lim_need = 0;
  expect("limiter stats_json size query (NULL, 0)",
         shmsched_limiter_stats_json(l, NULL, 0, &lim_need), SHMSCHED_STATUS_OK, NULL);
  char lim_small[2];
  size_t lim_need2 = 0;
  expect("limiter stats_json into 2 bytes",
         shmsched_limiter_stats_json(l, lim_small, sizeof lim_small, &lim_need2),
         SHMSCHED_STATUS_BUFFER_TOO_SMALL, "buffer holds 2");
  check(lim_need > 2 && lim_need2 == lim_need, "limiter stats_json: one length for both");
  shmsched_limiter_close(l);
  shmsched_region_close(r);
  unlink(path("lim"));
}

static void fair(void) {
  shmsched_region *r = create_region("fair", 0);
  shmsched_fair *f = NULL;
  expect("fair bad config", shmsched_fair_shared(r, "{\"ceiling\":-1}", 0, &f),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "fair-share configuration");
  expect("fair_shared capacity 1", shmsched_fair_shared(r, fair_config, 1, &f),
         SHMSCHED_STATUS_OK, NULL);
  shmsched_fair_outcome o;
  char why[512];
  expect("fair acquire", shmsched_fair_acquire(f, "a", 10, 50, 100, &o, why, sizeof why),
         SHMSCHED_STATUS_OK, NULL);
  check(o.granted && strcmp(o.lease_id, "a1") == 0 && o.deadline_ms == 150, "lease a1 granted");
  expect("fair acquire, unknown tenant",
         shmsched_fair_acquire(f, "nobody", 1, 50, 100, &o, NULL, 0),
         SHMSCHED_STATUS_UNKNOWN_TENANT, "unknown tenant \"nobody\"");
  /* In a region an earlier now is taken at the last accepted one (100):
   * not an error; here the one-slot table is full. */
  expect("fair acquire, an earlier now",
         shmsched_fair_acquire(f, "b", 1, 50, 50, &o, NULL, 0),
         SHMSCHED_STATUS_CAPACITY_EXHAUSTED, "lease table is full");
  expect("fair acquire, lease table full", shmsched_fair_acquire(f, "b", 1, 50, 100, &o, NULL, 0),
         SHMSCHED_STATUS_CAPACITY_EXHAUSTED, "lease table is full");
  expect("fair acquire, cost NaN-free negative",
         shmsched_fair_acquire(f, "b", -1, 50, 100, &o, NULL, 0),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "cost -1");
  expect("fair acquire over the ceiling", shmsched_fair_acquire(f, "b", 1000, 50, 100, &o, why,
                                                                sizeof why),
         SHMSCHED_STATUS_OK, NULL);
  check(!o.granted && o.reason == SHMSCHED_REFUSAL_REASON_EXCEEDS_CEILING && strlen(why) > 10 &&
            strcmp(shmsched_refusal_reason_name(o.reason), "exceeds_ceiling") == 0,
        "a refusal is an answer with a reason and an explanation");
  expect("fair release, unknown lease", shmsched_fair_release(f, "a99", 120),
         SHMSCHED_STATUS_UNKNOWN_LEASE, "unknown lease");
  expect("fair release", shmsched_fair_release(f, "a1", 120), SHMSCHED_STATUS_OK, NULL);
  expect("fair release twice", shmsched_fair_release(f, "a1", 121),
         SHMSCHED_STATUS_ALREADY_RELEASED, "already released");
  char json[4096];
  size_t len = 0;
  expect("fair stats", shmsched_fair_stats_json(f, 130, json, sizeof json, &len),
         SHMSCHED_STATUS_OK, NULL);
  check(strstr(json, "\"tenants\"") != NULL && strlen(json) == len, "fair stats as JSON");
  size_t fair_sized = 0;
  expect("fair stats size query (NULL, 0)", shmsched_fair_stats_json(f, 130, NULL, 0, &fair_sized),
         SHMSCHED_STATUS_OK, NULL);
  check(fair_sized == len, "fair stats: a size query gives the length without the NUL");
  /* The _now variants read CLOCK_MONOTONIC ms (later than every explicit
   * now above), under the ledger's lock. */
  check(shmsched_monotonic_ms() > 130, "the shared clock is past the explicit times");
  expect("fair acquire_now", shmsched_fair_acquire_now(f, "b", 10, 50, &o, NULL, 0),
         SHMSCHED_STATUS_OK, NULL);
  check(o.granted && strcmp(o.lease_id, "b1") == 0, "lease b1 granted at the clock");
  expect("fair release_now", shmsched_fair_release_now(f, "b1"), SHMSCHED_STATUS_OK, NULL);
  expect("fair stats_json_now", shmsched_fair_stats_json_now(f, json, sizeof json, &len),
         SHMSCHED_STATUS_OK, NULL);
  expect("fair explicit now after the clock (taken at the clock)",
         shmsched_fair_release(f, "b1", 200), SHMSCHED_STATUS_ALREADY_RELEASED,
         "already released");
  shmsched_fair_close(f);
  shmsched_region_close(r);
  unlink(path("fair"));
}

static void waitsets(void) {
  shmsched_region *r = create_region("ws", 0);
  shmsched_scheduler *s = NULL;
  expect("scheduler_shared", shmsched_scheduler_shared(r, 1, &s), SHMSCHED_STATUS_OK, NULL);
  shmsched_waitset *ws = NULL;
  expect("waitset_create(NULL)", shmsched_waitset_create(NULL), SHMSCHED_STATUS_NULL_ARGUMENT,
         "`out` is NULL");
  expect("waitset_create", shmsched_waitset_create(&ws), SHMSCHED_STATUS_OK, NULL);
  uint64_t id = 0;
  expect("acquire_start 0 units",
         shmsched_scheduler_acquire_start(s, 0, 0, SHMSCHED_FOREVER, ws, 1, &id),
         SHMSCHED_STATUS_INVALID_ARGUMENT, "n_units 0");
  expect("acquire_start priority 4",
         shmsched_scheduler_acquire_start(s, 4, 1, SHMSCHED_FOREVER, ws, 1, &id),
         SHMSCHED_STATUS_INVALID_PRIORITY, NULL);
  expect("acquire_start NULL waitset",
         shmsched_scheduler_acquire_start(s, 0, 1, SHMSCHED_FOREVER, NULL, 1, &id),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`ws` is NULL");
  expect("consume_start NULL limiter",
         shmsched_limiter_consume_start(NULL, 1, 0, SHMSCHED_FOREVER, ws, 1, &id),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`lim` is NULL");
  expect("waitset_cancel unknown", shmsched_waitset_cancel(ws, 12345),
         SHMSCHED_STATUS_ALREADY_RELEASED, "12345");
  size_t n = 0;
  expect("waitset_take NULL buffer", shmsched_waitset_take(ws, NULL, 4, &n),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`buf` is NULL");
  expect("waitset_take NULL out_n", shmsched_waitset_take(ws, NULL, 0, NULL),
         SHMSCHED_STATUS_NULL_ARGUMENT, "`out_n` is NULL");
  expect("waitset_wait empty", shmsched_waitset_wait(ws, 1000000, &n), SHMSCHED_STATUS_TIMEOUT,
         NULL);
  expect("waitset_wait NULL", shmsched_waitset_wait(NULL, 0, &n), SHMSCHED_STATUS_NULL_ARGUMENT,
         NULL);
  expect("waitset_interrupt NULL", shmsched_waitset_interrupt(NULL),
         SHMSCHED_STATUS_NULL_ARGUMENT, NULL);
  expect("waitset_pending NULL", shmsched_waitset_pending(ws, NULL),
         SHMSCHED_STATUS_NULL_ARGUMENT, NULL);
  int fd = -1;
  expect("waitset_fd NULL", shmsched_waitset_fd(NULL, &fd), SHMSCHED_STATUS_NULL_ARGUMENT, NULL);
  expect("waitset_fd", shmsched_waitset_fd(ws, &fd), SHMSCHED_STATUS_OK, NULL);
  shmsched_permit p;
  expect("acquire", shmsched_scheduler_acquire(s, 0, &p), SHMSCHED_STATUS_OK, NULL);
  expect("acquire_start", shmsched_scheduler_acquire_start(s, 0, 1, SHMSCHED_FOREVER, ws, 7, &id),
         SHMSCHED_STATUS_OK, NULL);
  expect("waitset_cancel", shmsched_waitset_cancel(ws, id), SHMSCHED_STATUS_OK, NULL);
  shmsched_completion c[2];
  expect("waitset_take", shmsched_waitset_take(ws, c, 2, &n), SHMSCHED_STATUS_OK, NULL);
  check(n == 1 && c[0].tag == 7 && c[0].kind == SHMSCHED_WAIT_ACQUIRE, "the cancelled wait");
  if (n == 1) {
    shmsched_last_error_message(NULL, 0);
    expect("a cancelled wait's completion", c[0].status, SHMSCHED_STATUS_CANCELLED, NULL);
    check(strstr(c[0].message, "cancelled") != NULL, "the completion carries the message");
  }
  expect("release", shmsched_permit_release(p), SHMSCHED_STATUS_OK, NULL);
  shmsched_waitset_close(ws);
  shmsched_waitset_close(NULL);
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  unlink(path("ws"));
}

static void misc(void) {
  check(shmsched_abi_version() == SHMSCHED_ABI_VERSION, "ABI version of the loaded library");
  check(shmsched_layout_version() == SHMSCHED_LAYOUT_VERSION, "layout version");
  check(strcmp(shmsched_strerror(SHMSCHED_STATUS_TIMEOUT), "timed out waiting for capacity") == 0,
        "strerror");
  check(strcmp(shmsched_strerror(9999), "unknown status code") == 0, "strerror of an unknown code");
  expect("debug panic", shmsched_debug_panic(), SHMSCHED_STATUS_INTERNAL,
         "the library panicked");
  /* A message longer than the buffer is cut and NUL-terminated. */
  shmsched_region *r;
  shmsched_status st = shmsched_region_create(path("ww"), 0666, 0, &r);
  check(st == SHMSCHED_STATUS_INVALID_ARGUMENT, "a failing call");
  char cut[8];
  size_t full = shmsched_last_error_message(cut, sizeof cut);
  check(full > sizeof cut && strlen(cut) == sizeof cut - 1, "truncated message");
  check(shmsched_last_error_message(NULL, 0) == full, "length query");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: status_codes PREFIX\n");
    return 2;
  }
  snprintf(prefix, sizeof prefix, "%s", argv[1]);
  regions();
  schedulers();
  limiters();
  async_waits();
  fair();
  waitsets();
  misc();
  printf("failures %d\n", failures);
  return failures == 0 ? 0 : 1;
}
