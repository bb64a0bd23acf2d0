// The C ABI as this binding declares it to koffi: every type and every
// function of ffi/include/shmsched.h, in one table. Nothing here loads the
// library, so a test can import this file to compare the table with the
// header (a function of the header missing here fails that test).
//
// Declarations are koffi's C-like syntax; `_Out_`/`_Inout_` mark outputs
// that koffi converts to JavaScript values. The outputs of the hot calls
// (a try_acquire's permit, a wait's id, the waitset's counts) are plain
// pointers instead, given a typed array the binding reads in place: koffi's
// conversion of an `_Out_` array or object costs several microseconds a
// call, the typed array a fraction of one.
// Handles are opaque pointers, which koffi passes as BigInt addresses: it
// cannot check them, so the binding never passes one that did not come
// from the library (see index.mjs, "handles").

/** Declares the ABI's types on `koffi` (once per process). */
export function defineTypes(koffi) {
  for (const name of ['shmsched_region', 'shmsched_scheduler', 'shmsched_limiter', 'shmsched_fair',
    'shmsched_waitset']) {
    koffi.opaque(name);
  }
  const u32x7 = koffi.array('uint32_t', 7, 'Array');
  const u64x7 = koffi.array('uint64_t', 7, 'Array');
  koffi.struct('shmsched_permit', { process: 'uint64_t', serial: 'uint64_t' });
  koffi.struct('shmsched_concurrency', { max: 'uint32_t', caps: u32x7 });
  koffi.struct('shmsched_grant', { immediate: 'bool', forced: 'bool' });
  koffi.struct('shmsched_region_info', {
    size: 'uint32_t', kind: 'uint32_t', layout_version: 'uint32_t', process_slots: 'uint32_t',
    total_size: 'uint64_t', created_at_unix_ms: 'uint64_t', created_pid: 'int32_t', reserved: 'uint32_t',
  });
  koffi.struct('shmsched_fair_outcome', {
    granted: 'bool', reason: 'uint32_t', retry_after_ms: 'int64_t', deadline_ms: 'uint64_t',
    lease_id: koffi.array('char', 64, 'String'),
  });
  const queue = koffi.struct('shmsched_queue_stats', {
    count: 'uint64_t', deferred: 'uint64_t', completed: 'uint64_t', cancelled: 'uint64_t',
  });
  koffi.struct('shmsched_scheduler_region_stats', {
    running: 'uint32_t', max: 'uint32_t', processes: 'uint32_t', waiters: u32x7,
    reclaimed: 'uint64_t', reaped_processes: 'uint64_t', stall_ns: 'uint64_t',
  });
  koffi.struct('shmsched_scheduler_stats', {
    size: 'uint32_t', concurrency: 'uint32_t', running: 'uint64_t', pending: 'uint64_t',
    stall_ns: 'uint64_t', total: queue, queues: koffi.array(queue, 7, 'Array'),
    has_region: 'uint32_t', reserved: 'uint32_t', region: 'shmsched_scheduler_region_stats',
  });
  const limQueue = koffi.struct('shmsched_limiter_queue_stats', {
    count: 'uint64_t', deferred: 'uint64_t', completed: 'uint64_t', cancelled: 'uint64_t',
    stall: 'uint64_t',
  });
  koffi.struct('shmsched_limiter_region_stats', {
    forced: 'uint64_t', waiters: u64x7, processes: 'uint32_t', tsc_clock: 'uint32_t',
    stall_ns: 'uint64_t', wakes: 'uint64_t', consumed: u64x7, refunded: u64x7,
  });
  koffi.struct('shmsched_limiter_stats', {
    size: 'uint32_t', tokens_per_second: 'uint32_t', tokens: 'int64_t', pending: 'uint64_t',
    forced: 'uint64_t', clock: 'uint64_t', stall_ns: 'uint64_t', total: queue,
    queues: koffi.array(limQueue, 7, 'Array'), has_region: 'uint32_t', reserved: 'uint32_t',
    region: 'shmsched_limiter_region_stats', consumed: u64x7, refunded: u64x7,
  });
  koffi.struct('shmsched_completion', {
    tag: 'uint64_t', id: 'uint64_t', permit: 'shmsched_permit', status: 'uint32_t', kind: 'uint32_t',
    grant: 'shmsched_grant', reserved: koffi.array('uint8_t', 6, 'Array'),
    message: koffi.array('char', 128, 'String'),
  });
  koffi.proto('void shmsched_acquire_callback(void *ctx, uint32_t status, shmsched_permit permit, const char *message)');
  koffi.proto('void shmsched_consume_callback(void *ctx, uint32_t status, shmsched_grant grant, const char *message)');
}

/** Every function of the header, as koffi declarations (header order). */
export const FUNCTIONS = Object.freeze([
  // lib.rs
  'uint32_t shmsched_abi_version()',
  'uint32_t shmsched_layout_version()',
  'uint64_t shmsched_monotonic_ms()',
  'uint32_t shmsched_debug_panic()',
  // fair.rs
  'const char *shmsched_refusal_reason_name(uint32_t reason)',
  'uint32_t shmsched_fair_shared(shmsched_region *region, const char *config_json, uint32_t lease_capacity, _Out_ shmsched_fair **out)',
  'uint32_t shmsched_fair_attach(shmsched_region *region, _Out_ shmsched_fair **out)',
  'uint32_t shmsched_fair_acquire(shmsched_fair *fair, const char *tenant, double cost, uint64_t hold_ms, uint64_t now_ms, _Out_ shmsched_fair_outcome *out, _Out_ uint8_t *explanation, size_t explanation_len)',
  'uint32_t shmsched_fair_acquire_now(shmsched_fair *fair, const char *tenant, double cost, uint64_t hold_ms, _Out_ shmsched_fair_outcome *out, _Out_ uint8_t *explanation, size_t explanation_len)',
  'uint32_t shmsched_fair_release(shmsched_fair *fair, const char *lease_id, uint64_t now_ms)',
  'uint32_t shmsched_fair_release_now(shmsched_fair *fair, const char *lease_id)',
  'uint32_t shmsched_fair_stats_json(shmsched_fair *fair, uint64_t now_ms, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'uint32_t shmsched_fair_stats_json_now(shmsched_fair *fair, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'uint32_t shmsched_fair_reap(shmsched_fair *fair, _Out_ uint32_t *out_processes, _Out_ uint64_t *out_leases)',
  'void shmsched_fair_close(shmsched_fair *fair)',
  // limiter.rs
  'uint32_t shmsched_limiter_shared(shmsched_region *region, uint64_t tokens_per_second, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_shared_with_capacity(shmsched_region *region, uint64_t tokens_per_second, uint64_t capacity, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_attach(shmsched_region *region, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_child(shmsched_limiter *parent, uint64_t tokens_per_second, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_child_with_capacity(shmsched_limiter *parent, uint64_t tokens_per_second, uint64_t capacity, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_consume(shmsched_limiter *lim, uint64_t n, int32_t priority, _Out_ shmsched_grant *out_grant)',
  'uint32_t shmsched_limiter_consume_timeout(shmsched_limiter *lim, uint64_t n, int32_t priority, uint64_t timeout_ns, _Out_ shmsched_grant *out_grant)',
  'uint32_t shmsched_limiter_consume_async(shmsched_limiter *lim, uint64_t n, int32_t priority, uint64_t timeout_ns, shmsched_consume_callback *callback, void *ctx)',
  'uint32_t shmsched_limiter_try_consume(shmsched_limiter *lim, uint64_t n)',
  'uint32_t shmsched_limiter_try_consume_at(shmsched_limiter *lim, uint64_t n, int32_t priority)',
  'uint32_t shmsched_limiter_tokens(shmsched_limiter *lim, _Out_ int64_t *out)',
  'uint32_t shmsched_limiter_tokens_per_second(shmsched_limiter *lim, _Out_ uint32_t *out)',
  'uint32_t shmsched_limiter_capacity(shmsched_limiter *lim, _Out_ uint32_t *out)',
  'uint32_t shmsched_limiter_set_rate(shmsched_limiter *lim, uint64_t tokens_per_second)',
  'uint32_t shmsched_limiter_set_capacity(shmsched_limiter *lim, uint64_t capacity)',
  'uint32_t shmsched_limiter_reap(shmsched_limiter *lim, _Out_ uint32_t *out_processes)',
  'uint32_t shmsched_limiter_get_stats(shmsched_limiter *lim, _Inout_ shmsched_limiter_stats *out)',
  'uint32_t shmsched_limiter_stats_json(shmsched_limiter *lim, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'uint32_t shmsched_limiter_detach(shmsched_limiter *lim)',
  'void shmsched_limiter_close(shmsched_limiter *lim)',
  // region.rs
  'uint32_t shmsched_region_create(const char *name, uint32_t mode, uint32_t process_slots, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_open(const char *name, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_open_or_create(const char *name, uint32_t mode, uint32_t process_slots, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_anonymous(uint32_t process_slots, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_open_fd(int32_t fd, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_dup_fd(shmsched_region *region, _Out_ int32_t *out_fd)',
  'uint32_t shmsched_region_remove(const char *name)',
  'uint32_t shmsched_region_get_info(shmsched_region *region, _Inout_ shmsched_region_info *out)',
  'void shmsched_region_close(shmsched_region *region)',
  // scheduler.rs
  'shmsched_concurrency shmsched_concurrency_max(uint32_t max)',
  'uint32_t shmsched_concurrency_set_cap(_Inout_ shmsched_concurrency *c, int32_t priority, uint32_t cap)',
  'uint32_t shmsched_scheduler_shared(shmsched_region *region, uint32_t max, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_shared_with(shmsched_region *region, shmsched_concurrency *c, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_attach(shmsched_region *region, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_child(shmsched_scheduler *parent, uint32_t max, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_child_with(shmsched_scheduler *parent, shmsched_concurrency *c, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_acquire(shmsched_scheduler *sched, int32_t priority, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_acquire_timeout(shmsched_scheduler *sched, int32_t priority, uint64_t timeout_ns, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_acquire_async(shmsched_scheduler *sched, int32_t priority, uint64_t timeout_ns, shmsched_acquire_callback *callback, void *ctx)',
  'uint32_t shmsched_scheduler_try_acquire(shmsched_scheduler *sched, int32_t priority, shmsched_permit *out)',
  'uint32_t shmsched_scheduler_acquire_many(shmsched_scheduler *sched, int32_t priority, uint32_t n, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_acquire_many_timeout(shmsched_scheduler *sched, int32_t priority, uint32_t n, uint64_t timeout_ns, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_try_acquire_many(shmsched_scheduler *sched, int32_t priority, uint32_t n, shmsched_permit *out)',
  'uint32_t shmsched_permit_release(shmsched_permit permit)',
  'uint32_t shmsched_scheduler_dispose(shmsched_scheduler *sched)',
  'uint32_t shmsched_scheduler_is_disposed(shmsched_scheduler *sched, _Out_ bool *out)',
  'uint32_t shmsched_scheduler_reap(shmsched_scheduler *sched, _Out_ uint32_t *out_processes, _Out_ uint64_t *out_slots)',
  'uint32_t shmsched_scheduler_global_running(shmsched_scheduler *sched, _Out_ uint32_t *out)',
  'uint32_t shmsched_scheduler_concurrency(shmsched_scheduler *sched, _Out_ uint32_t *out)',
  'uint32_t shmsched_scheduler_set_lottery(shmsched_scheduler *sched, uint64_t seed, bool enabled)',
  'uint32_t shmsched_scheduler_set_ceiling(shmsched_scheduler *sched, uint32_t target, _Out_ bool *out_reached)',
  'uint32_t shmsched_scheduler_ceiling(shmsched_scheduler *sched, _Out_ uint32_t *out)',
  'uint32_t shmsched_scheduler_get_stats(shmsched_scheduler *sched, _Inout_ shmsched_scheduler_stats *out)',
  'uint32_t shmsched_scheduler_stats_json(shmsched_scheduler *sched, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'uint32_t shmsched_scheduler_detach(shmsched_scheduler *sched)',
  'void shmsched_scheduler_close(shmsched_scheduler *sched)',
  // status.rs
  'size_t shmsched_last_error_message(_Out_ uint8_t *buf, size_t len)',
  'const char *shmsched_strerror(uint32_t status)',
  // waitset.rs (`buf` of take is a Buffer of `cap` completions, read in place)
  'uint32_t shmsched_waitset_create(_Out_ shmsched_waitset **out)',
  'uint32_t shmsched_waitset_fd(shmsched_waitset *ws, _Out_ int32_t *out_fd)',
  'uint32_t shmsched_scheduler_acquire_start(shmsched_scheduler *sched, int32_t priority, uint32_t n_units, uint64_t timeout_ns, shmsched_waitset *ws, uint64_t tag, uint64_t *out_id)',
  'uint32_t shmsched_limiter_consume_start(shmsched_limiter *lim, uint64_t n, int32_t priority, uint64_t timeout_ns, shmsched_waitset *ws, uint64_t tag, uint64_t *out_id)',
  'uint32_t shmsched_waitset_cancel(shmsched_waitset *ws, uint64_t id)',
  'uint32_t shmsched_waitset_take(shmsched_waitset *ws, void *buf, size_t cap, size_t *out_n)',
  'uint32_t shmsched_waitset_wait(shmsched_waitset *ws, uint64_t timeout_ns, size_t *out_ready)',
  'uint32_t shmsched_waitset_interrupt(shmsched_waitset *ws)',
  'uint32_t shmsched_waitset_pending(shmsched_waitset *ws, _Out_ size_t *out)',
  'void shmsched_waitset_close(shmsched_waitset *ws)',
]);

/** The C name of a declaration. */
export function functionName(decl) {
  return decl.match(/(shmsched_\w+)\s*\(/)[1];
}

/** The names of every function bound (what a parity test compares with the
 * header's function list). */
export const FUNCTION_NAMES = Object.freeze(FUNCTIONS.map(functionName));
