// The runtime of the host SIMT emulation (simt_emu.h): fibers, block barrier,
// warp collectives, mma.sync from the PTX ISA fragment tables, the tensor
// arena and the memory checker behind the -fsanitize=thread hooks. Built
// without instrumentation; the kernel translation unit (emu_kernels.cpp) is
// the instrumented one.
#include "simt_emu.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "simt_emu_runtime.h"

// Fiber switch: saves the callee-saved registers on the current stack, stores
// the stack pointer in *from, continues on `to` (x86-64 System V; elsewhere
// ucontext, about 50x slower because it saves the signal mask by syscall).
#if defined(__x86_64__)
extern "C" void lam_emu_switch(void** from, void* to);
asm(R"(
.text
.globl lam_emu_switch
.type lam_emu_switch, @function
lam_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size lam_emu_switch, .-lam_emu_switch
)");
#endif

extern "C" char __start_lam_emu_shared[] __attribute__((weak));
extern "C" char __stop_lam_emu_shared[] __attribute__((weak));

namespace emu {

Thread* g_thread = nullptr;
Launch g_launch;

namespace {

constexpr size_t kStackBytes = 256 << 10;
constexpr int kMaxThreads = 1024;
constexpr uint64_t kArenaSlot = uint64_t{64} << 30;  // 64 GiB of address space per tensor
constexpr int kArenaSlots = 15;

enum class State { kRunnable, kAtBarrier, kAtWarp, kAtMbarrier, kExited };

struct Context {
#if defined(__x86_64__)
  void* sp;
#else
  ucontext_t uc;
#endif
};

struct PendingCopy {  // a cp.async whose group this thread has not waited for
  size_t offset;       // shared offset of the 16 destination bytes
  uint4 data;
  int group;           // index of the commit group it belongs to (== commits: not committed yet)
  int line;
};

struct Fiber {
  Thread thread;
  Context ctx;
  State state;
  int line;  // where it waits
  std::vector<PendingCopy> pending;
  int commits;  // cp.async.commit_group calls so far in this block
  bool dependency_waited;  // griddepcontrol.wait done
  std::vector<uint32_t> observed;  // per mbarrier slot: phases [0, n) whose completion this thread observed
  int64_t fence_epoch;             // the barrier epoch of its last fence.proxy.async (-1: none)
  int wait_slot;                   // kAtMbarrier: the mbarrier slot and parity it waits for
  unsigned int wait_parity;
};

// An mbarrier of this block (its 8 bytes in shared memory hold nothing here).
struct MBarrier {
  size_t offset;         // shared index of its 8 bytes
  int init_tid;          // the thread that initialised it, in barrier epoch init_epoch
  uint32_t init_epoch;
  uint32_t count;        // arrivals per phase
  uint32_t pending;      // arrivals the current phase still needs
  int64_t tx;            // transaction bytes the current phase still expects
  uint32_t phase;        // phases completed
  int64_t copied_phase;  // the last phase a bulk copy completes on (-1: none)
  int copy_line;
};

struct WarpSync {
  uint32_t arrived = 0, mask = 0;
  int line = -1, kind = -1, parity = 0;
  uint64_t value[2][32];
  // mma: per lane a0..a3, b0, b1 in, c[4] in / out
  uint32_t a[2][32][4], b[2][32][2];
  float c[2][32][4];
};

struct Tensor {
  std::string name;
  char* base;
  size_t bytes;
  bool writable;
  uint64_t loaded = 0;  // bytes the kernels requested from it (every global load, cp.async and TMA source)
};

struct Shadow {  // per shared byte, for this block
  uint16_t writer;  // tid + 1 of the last writer, 0: never written
  uint16_t reader;  // tid + 1 of the last reader this epoch
  uint32_t write_epoch, read_epoch;
  bool many_readers;
  uint16_t inflight;  // tid + 1 of the thread whose cp.async into this byte is not waited for yet
  uint16_t tma_bar;   // slot + 1 of the mbarrier whose phase tma_phase a bulk copy of this byte completes, 0: none
  uint32_t tma_phase;
};
constexpr uint16_t kAsyncProxy = 0xFFFF;        // Shadow::writer of bytes a bulk copy wrote
constexpr uint32_t kNoEpoch = 0xFFFFFFFFu;       // their write_epoch: ordered by the mbarrier, not a barrier

struct State_ {
  // configuration
  bool scramble = false;
  std::mt19937_64 rng{1};
  // arena
  char* arena = nullptr;
  std::vector<Tensor> tensors;
  // launch
  const char* kernel = "";
  void (*entry)(void*) = nullptr;
  void* closure = nullptr;
  std::vector<Fiber> fibers;
  char* stacks = nullptr;
  Context scheduler;
  int nthreads = 0, live = 0, at_barrier = 0, barrier_line = -1;
  uint32_t epoch = 0;
  // __syncthreads_and by the parity of the barrier's epoch: the predicates
  // folded while threads arrive, and the result they read once released (the
  // next barrier uses the other slot, so a fast thread cannot clobber it).
  int barrier_and[2] = {1, 1};
  std::vector<WarpSync> warps;
  std::vector<MBarrier> mbarriers;  // this block's, by slot
  bool in_kernel = false;
  bool programmatic = false;  // the launch's kernel may start before the previous one ends
  bool failed = false;
  std::string error;
  // Shared memory as one index space: the static section's bytes, then the
  // dynamic region's (kMaxDynamicShared, the launch's dynamic_bytes of it usable).
  std::vector<Shadow> shadow;
  char* dynamic = nullptr;
  size_t dynamic_bytes = 0;
  size_t touched_lo = SIZE_MAX, touched_hi = 0;  // shared indices accessed since the last reset
  uint64_t blocks_run = 0, barriers = 0, collectives = 0;
  uint64_t noise_words = 0, noise_logs = 0;  // count(): since the last reset
  uint64_t mma_ops = 0;                      // warp-wide mma.sync m16n8k16 since the last reset
};
State_ S;

void switch_to(Context& from, Context& to) {
#if defined(__x86_64__)
  lam_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

char* shared_lo() { return __start_lam_emu_shared; }
size_t shared_bytes() {
  return __start_lam_emu_shared == nullptr ? 0 : static_cast<size_t>(__stop_lam_emu_shared - __start_lam_emu_shared);
}
// The bytes at shared index i (static section, then the dynamic region).
char* shared_at(size_t i) { return i < shared_bytes() ? shared_lo() + i : S.dynamic + (i - shared_bytes()); }
// The shared index of address a, or false when a is not shared memory.
bool shared_index(uintptr_t a, size_t* i) {
  if (a - reinterpret_cast<uintptr_t>(shared_lo()) < shared_bytes()) {
    *i = a - reinterpret_cast<uintptr_t>(shared_lo());
    return true;
  }
  if (S.dynamic != nullptr && a - reinterpret_cast<uintptr_t>(S.dynamic) < kMaxDynamicShared) {
    *i = shared_bytes() + (a - reinterpret_cast<uintptr_t>(S.dynamic));
    return true;
  }
  return false;
}
// Poison (0xA5...) the shared indices [lo, hi): the data and the shadow.
void poison(size_t lo, size_t hi) {
  const size_t sb = shared_bytes();
  if (lo < std::min(hi, sb)) std::memset(shared_lo() + lo, 0xA5, std::min(hi, sb) - lo);
  if (std::max(lo, sb) < hi) std::memset(S.dynamic + (std::max(lo, sb) - sb), 0xA5, hi - std::max(lo, sb));
  std::memset(S.shadow.data() + lo, 0, (hi - lo) * sizeof(Shadow));
}

std::string where() {
  char buf[256];
  if (g_thread == nullptr) return std::string(S.kernel);
  std::snprintf(buf, sizeof buf, "%s block (%u,%u) thread %d (warp %d lane %d)", S.kernel, g_launch.block_idx.x,
                g_launch.block_idx.y, g_thread->tid, g_thread->tid / 32, g_thread->tid % 32);
  return buf;
}

[[noreturn]] void abort_block(const std::string& msg) {
  if (!S.failed) {
    S.failed = true;
    S.error = msg;
  }
  switch_to(S.fibers[g_thread->tid].ctx, S.scheduler);
  __builtin_unreachable();
}

std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

void yield(State st, int line) {
  Fiber& f = S.fibers[g_thread->tid];
  f.state = st;
  f.line = line;
  switch_to(f.ctx, S.scheduler);
}

[[noreturn]] void fiber_main() {
  const int tid = g_thread->tid;
  S.entry(S.closure);
  if (!S.fibers[tid].pending.empty()) {
    const PendingCopy& c = S.fibers[tid].pending.front();
    abort_block(where() + ": exits with " + std::to_string(S.fibers[tid].pending.size()) +
                " cp.async copies not waited for (the first issued at line " + std::to_string(c.line) +
                ", shared offset " + std::to_string(c.offset) + ")");
  }
  S.fibers[tid].state = State::kExited;
  --S.live;
  switch_to(S.fibers[tid].ctx, S.scheduler);
  __builtin_unreachable();
}

void start_fiber(Fiber& f, char* stack, size_t bytes) {
#if defined(__x86_64__)
  // a frame lam_emu_switch "returns" into: six saved registers, then fiber_main
  // as the return address, with the stack 16-byte aligned at its entry + 8.
  auto* top = reinterpret_cast<void**>((reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15}) - 8);
  *--top = reinterpret_cast<void*>(fiber_main);
  for (int i = 0; i < 6; ++i) *--top = nullptr;
  f.ctx.sp = top;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = stack;
  f.ctx.uc.uc_stack.ss_size = bytes;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, reinterpret_cast<void (*)()>(+[] { fiber_main(); }), 0);
#endif
}

std::string describe_states() {
  std::string s;
  // (the block's threads only: S.fibers keeps the stacks of kMaxThreads)
  int exited = 0;
  for (int t = 0; t < S.nthreads; ++t) exited += S.fibers[t].state == State::kExited;
  s += format("%d of %d threads exited", exited, S.nthreads);
  int shown = 0;
  for (int t = 0; t < S.nthreads; ++t) {
    const Fiber& f = S.fibers[t];
    if (f.state == State::kExited || shown >= 6) continue;
    s += format("; thread %d waits at %s line %d", f.thread.tid,
                f.state == State::kAtBarrier     ? "__syncthreads"
                : f.state == State::kAtMbarrier ? "an mbarrier wait (phase never completes)"
                                                : "a warp collective",
                f.line);
    ++shown;
  }
  return s;
}

bool run_block() {
  const int n = S.nthreads;
  S.live = n;
  S.at_barrier = 0;
  S.barrier_line = -1;
  S.epoch = 0;
  S.barrier_and[0] = S.barrier_and[1] = 1;
  for (WarpSync& w : S.warps) w = WarpSync{};
  S.mbarriers.clear();
  // Poison what the previous block touched (the rest still is): 0xA5A5... as
  // a key, a float, an index; and forget its shadow. Resetting only the
  // touched range keeps a block cheap however many kernels' __shared__
  // arrays the section holds.
  if (S.touched_lo < S.touched_hi) poison(S.touched_lo, S.touched_hi);
  S.touched_lo = SIZE_MAX;
  S.touched_hi = 0;
  for (int t = 0; t < n; ++t) {
    Fiber& f = S.fibers[t];
    f.thread.tid = t;
    f.thread.thread_idx = uint3{static_cast<unsigned>(t) % g_launch.block_dim.x,
                                static_cast<unsigned>(t) / g_launch.block_dim.x % g_launch.block_dim.y,
                                static_cast<unsigned>(t) / (g_launch.block_dim.x * g_launch.block_dim.y)};
    f.state = State::kRunnable;
    f.line = -1;
    f.pending.clear();
    f.commits = 0;
    f.dependency_waited = false;
    f.observed.clear();
    f.fence_epoch = -1;
    f.wait_slot = -1;
    start_fiber(f, S.stacks + static_cast<size_t>(t) * kStackBytes, kStackBytes);
  }
  std::vector<int> order(n);
  for (int t = 0; t < n; ++t) order[t] = t;
  S.in_kernel = true;
  while (S.live > 0) {
    if (S.scramble) std::shuffle(order.begin(), order.end(), S.rng);
    bool ran = false;
    for (int t : order) {
      if (S.fibers[t].state != State::kRunnable) continue;
      ran = true;
      g_thread = &S.fibers[t].thread;
      switch_to(S.scheduler, S.fibers[t].ctx);
      if (S.failed) break;
    }
    if (S.failed) break;
    if (!ran) {
      g_thread = nullptr;
      S.failed = true;
      S.error = format("%s block (%u,%u): deadlock: %s", S.kernel, g_launch.block_idx.x, g_launch.block_idx.y,
                       describe_states().c_str());
      break;
    }
  }
  S.in_kernel = false;
  g_thread = nullptr;
  // A bulk copy whose phase no thread observed may still be writing the
  // block's shared memory when the block exits on the GPU.
  for (size_t slot = 0; slot < S.mbarriers.size() && !S.failed; ++slot) {
    const MBarrier& m = S.mbarriers[slot];
    uint32_t seen = 0;
    for (int t = 0; t < n; ++t)
      if (slot < S.fibers[t].observed.size()) seen = std::max(seen, S.fibers[t].observed[slot]);
    if (m.copied_phase >= 0 && seen <= m.copied_phase) {
      S.failed = true;
      S.error = format("%s block (%u,%u): exits with a bulk tensor copy (line %d) whose mbarrier (shared offset %zu) "
                       "phase %lld no thread waited for", S.kernel, g_launch.block_idx.x, g_launch.block_idx.y,
                       m.copy_line, m.offset, static_cast<long long>(m.copied_phase));
    }
  }
  ++S.blocks_run;
  return !S.failed;
}

}  // namespace

[[noreturn]] void fail(int line, const char* what) {
  abort_block(format("%s: line %d: %s", where().c_str(), line, what));
}

void syncthreads(int line) {
  if (S.at_barrier == 0) {
    S.barrier_line = line;
  } else if (S.barrier_line != line) {
    abort_block(format("%s: divergent __syncthreads: line %d while other threads wait at line %d", where().c_str(),
                       line, S.barrier_line));
  }
  ++S.barriers;
  if (++S.at_barrier == S.nthreads) {  // every thread of the block (exited ones never arrive: deadlock)
    S.at_barrier = 0;
    ++S.epoch;
    for (Fiber& f : S.fibers)
      if (f.state == State::kAtBarrier) f.state = State::kRunnable;
    return;
  }
  yield(State::kAtBarrier, line);
}

int syncthreads_and(int line, int predicate) {
  const int slot = S.epoch & 1;
  if (S.at_barrier == 0) S.barrier_and[slot] = 1;
  S.barrier_and[slot] &= predicate != 0 ? 1 : 0;
  syncthreads(line);
  return S.barrier_and[slot];
}

namespace {

// Arrives at warp collective `kind` at `line`; returns the parity slot the
// results are in once every lane of `mask` has arrived.
template <typename Deposit, typename Complete>
int warp_collective(int kind, int line, unsigned int mask, Deposit deposit, Complete complete) {
  const int tid = g_thread->tid, lane = tid % 32;
  WarpSync& w = S.warps[tid / 32];
  ++S.collectives;
  if (!((mask >> lane) & 1u))
    abort_block(format("%s: line %d: lane %d runs a warp collective whose mask 0x%08x excludes it", where().c_str(),
                       line, lane, mask));
  if (w.arrived == 0) {
    w.mask = mask;
    w.line = line;
    w.kind = kind;
  } else if (w.mask != mask || w.line != line || w.kind != kind) {
    abort_block(format("%s: line %d mask 0x%08x: warp collective diverges from lanes 0x%08x waiting at line %d "
                       "mask 0x%08x", where().c_str(), line, mask, w.arrived, w.line, w.mask));
  }
  const int parity = w.parity;
  deposit(w, parity, lane);
  w.arrived |= 1u << lane;
  if (w.arrived == mask) {
    complete(w, parity);
    w.arrived = 0;
    w.parity ^= 1;
    const int base = tid / 32 * 32;
    for (int l = 0; l < 32 && base + l < S.nthreads; ++l)
      if (S.fibers[base + l].state == State::kAtWarp && ((mask >> l) & 1u)) S.fibers[base + l].state = State::kRunnable;
    return parity;
  }
  yield(State::kAtWarp, line);
  return parity;
}

float half_bits_to_float(MmaInput input, uint32_t h) {
  if (input == MmaInput::kBFloat16) return __uint_as_float(h << 16);
  return __half2float(__half{static_cast<unsigned short>(h)});
}

}  // namespace

uint64_t shfl(int line, unsigned int mask, uint64_t value, int src_lane) {
  const int parity = warp_collective(
      0, line, mask, [&](WarpSync& w, int p, int lane) { w.value[p][lane] = value; }, [](WarpSync&, int) {});
  if (!((mask >> src_lane) & 1u))
    abort_block(format("%s: line %d: shuffle reads lane %d, outside the mask 0x%08x", where().c_str(), line, src_lane,
                       mask));
  return S.warps[g_thread->tid / 32].value[parity][src_lane];
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32, written from the PTX
// ISA fragment tables ("Matrix Fragments for mma.m16n8k16 with floating point
// type"), independently of common/mma_fragment.h. Lane l, group g = l >> 2,
// t = l % 4. A: a_i (i = 0..7, register i / 2, half i % 2) at row g (+8 for
// a2,a3,a6,a7), col 2t + (i & 1) (+8 for a4..a7); B: b_i (i = 0..3) at row
// 2t + (i & 1) (+8 for b2, b3), col g; C: c_i at row g (+8 for c2, c3), col
// 2t + (i & 1). D = C + A B: each product exact, the 16-term sum and the add of
// C done in double and rounded once to float32 (real tensor cores round
// differently; see DESIGN.md, "Host emulation").
void mma_m16n8k16(MmaInput input, float (&c)[4], unsigned int a0, unsigned int a1, unsigned int a2, unsigned int a3,
                  unsigned int b0, unsigned int b1, int line) {
  const int parity = warp_collective(
      1, line, 0xFFFFFFFFu,
      [&](WarpSync& w, int p, int lane) {
        const uint32_t a[4] = {a0, a1, a2, a3};
        std::memcpy(w.a[p][lane], a, sizeof a);
        w.b[p][lane][0] = b0;
        w.b[p][lane][1] = b1;
        std::memcpy(w.c[p][lane], c, sizeof(float) * 4);
      },
      [&](WarpSync& w, int p) {
        ++S.mma_ops;
        double A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; ++l) {
          const int g = l >> 2, t = l % 4;
          for (int i = 0; i < 8; ++i) {
            const uint32_t reg = w.a[p][l][i / 2];
            const uint32_t h = (i % 2) ? (reg >> 16) : (reg & 0xFFFFu);
            const int row = g + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0);
            const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = half_bits_to_float(input, h);
          }
          for (int i = 0; i < 4; ++i) {
            const uint32_t reg = w.b[p][l][i / 2];
            const uint32_t h = (i % 2) ? (reg >> 16) : (reg & 0xFFFFu);
            B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = half_bits_to_float(input, h);
          }
          for (int i = 0; i < 4; ++i) C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = w.c[p][l][i];
        }
        for (int l = 0; l < 32; ++l) {
          const int g = l >> 2, t = l % 4;
          for (int i = 0; i < 4; ++i) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double s = C[row][col];
            for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
            w.c[p][l][i] = static_cast<float>(s);
          }
        }
      });
  std::memcpy(c, S.warps[g_thread->tid / 32].c[parity][g_thread->tid % 32], sizeof(float) * 4);
}

// ---- cp.async: issue, commit, wait (per thread, like the PTX groups) ----

static void check_shared(size_t off, size_t n, bool write);

// An access of n bytes at shared index off inside the launch's dynamic shared
// memory (when it falls in the dynamic region).
static void check_dynamic_extent(size_t off, size_t n, const char* what) {
  if (off < shared_bytes()) return;
  const size_t d = off - shared_bytes();
  if (d + n > S.dynamic_bytes)
    abort_block(format("%s: %s of %zu bytes at dynamic shared offset %zu, past the launch's %zu bytes of dynamic "
                       "shared memory", where().c_str(), what, n, d, S.dynamic_bytes));
}

// The race checks of a write, without recording it: a cp.async may land any
// time between its issue and the wait, so at issue its bytes must be free of
// other threads' accesses since the last barrier.
static void check_async_issue(size_t off, int line) {
  const uint16_t me = static_cast<uint16_t>(g_thread->tid + 1);
  for (size_t i = 0; i < 16; ++i) {
    const Shadow& s = S.shadow[off + i];
    if (s.inflight)
      abort_block(format("%s: line %d: cp.async into shared offset %zu while thread %d's earlier cp.async into it is "
                         "in flight", where().c_str(), line, off, s.inflight - 1));
    if (s.writer != 0 && s.writer != me && s.write_epoch == S.epoch)
      abort_block(format("%s: line %d: shared race: cp.async into shared offset %zu, written by thread %d since the "
                         "last __syncthreads", where().c_str(), line, off, s.writer - 1));
    if (s.read_epoch == S.epoch && s.reader != 0 && (s.many_readers || s.reader != me))
      abort_block(format("%s: line %d: shared race: cp.async into shared offset %zu, read by thread %d since the last "
                         "__syncthreads (a stage refilled before every thread is done with it)", where().c_str(),
                         line, off, s.reader - 1));
  }
}

void cp_async(int line, void* smem_dst, const uint4& data) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(smem_dst);
  size_t off = 0;
  if (!shared_index(a, &off) || (off < shared_bytes() && off + 16 > shared_bytes()))
    abort_block(format("%s: line %d: cp.async destination is not shared memory", where().c_str(), line));
  check_dynamic_extent(off, 16, "cp.async");
  if (a % 16 != 0)
    abort_block(format("%s: line %d: cp.async destination at shared offset %zu is not 16-byte aligned",
                       where().c_str(), line, off));
  check_async_issue(off, line);
  S.touched_lo = std::min(S.touched_lo, off);
  S.touched_hi = std::max(S.touched_hi, off + 16);
  for (size_t i = 0; i < 16; ++i) S.shadow[off + i].inflight = static_cast<uint16_t>(g_thread->tid + 1);
  Fiber& f = S.fibers[g_thread->tid];
  f.pending.push_back(PendingCopy{off, data, f.commits, line});
}

void grid_dependency_wait(int) { S.fibers[g_thread->tid].dependency_waited = true; }
void set_programmatic_launch(bool on) { S.programmatic = on; }

// ---- mbarrier and the bulk tensor copy (TMA) ----

static void check_global(uintptr_t a, size_t n, bool write);

namespace {

// The slot of the mbarrier at `bar` (initialised, and visible to this thread).
size_t mbarrier_slot(int line, void* bar, const char* what) {
  size_t off = 0;
  if (!shared_index(reinterpret_cast<uintptr_t>(bar), &off))
    abort_block(format("%s: line %d: %s: the mbarrier is not in shared memory", where().c_str(), line, what));
  for (size_t slot = 0; slot < S.mbarriers.size(); ++slot) {
    const MBarrier& m = S.mbarriers[slot];
    if (m.offset != off) continue;
    if (m.init_tid != g_thread->tid && m.init_epoch == S.epoch)
      abort_block(format("%s: line %d: %s on the mbarrier at shared offset %zu that thread %d initialised after the "
                         "last __syncthreads (its init is not visible here)", where().c_str(), line, what, off,
                         m.init_tid));
    return slot;
  }
  abort_block(format("%s: line %d: %s on an uninitialised mbarrier (shared offset %zu)", where().c_str(), line, what,
                     off));
}

// The current phase completes when every arrival and every expected byte is in.
void mbarrier_maybe_complete(size_t slot) {
  MBarrier& m = S.mbarriers[slot];
  if (m.pending != 0 || m.tx != 0) return;
  ++m.phase;
  m.pending = m.count;
  for (int t = 0; t < S.nthreads; ++t) {
    Fiber& f = S.fibers[t];
    if (f.state == State::kAtMbarrier && f.wait_slot == static_cast<int>(slot)) f.state = State::kRunnable;
  }
}

void mbarrier_observe(size_t slot, uint32_t phases) {
  std::vector<uint32_t>& seen = S.fibers[g_thread->tid].observed;
  if (seen.size() <= slot) seen.resize(slot + 1, 0);
  seen[slot] = std::max(seen[slot], phases);
}

}  // namespace

void mbarrier_init(int line, void* bar, unsigned int count) {
  size_t off = 0;
  if (!shared_index(reinterpret_cast<uintptr_t>(bar), &off) || reinterpret_cast<uintptr_t>(bar) % 8 != 0)
    abort_block(format("%s: line %d: mbarrier.init of an object that is not 8-byte aligned shared memory",
                       where().c_str(), line));
  if (count == 0) abort_block(format("%s: line %d: mbarrier.init with a count of 0", where().c_str(), line));
  check_dynamic_extent(off, 8, "mbarrier.init");
  const MBarrier fresh{off, g_thread->tid, S.epoch, count, count, 0, 0, -1, line};
  for (size_t slot = 0; slot < S.mbarriers.size(); ++slot) {
    if (S.mbarriers[slot].offset != off) continue;
    S.mbarriers[slot] = fresh;  // re-initialised: the phases start again
    for (Fiber& f : S.fibers)
      if (slot < f.observed.size()) f.observed[slot] = 0;
    return;
  }
  S.mbarriers.push_back(fresh);
}

void mbarrier_arrive_expect_tx(int line, void* bar, unsigned int bytes) {
  const size_t slot = mbarrier_slot(line, bar, "mbarrier.arrive.expect_tx");
  MBarrier& m = S.mbarriers[slot];
  m.tx += bytes;
  if (m.pending == 0)  // (cannot happen: a phase completes as its last arrival comes in)
    abort_block(format("%s: line %d: mbarrier arrival past its count", where().c_str(), line));
  --m.pending;
  mbarrier_maybe_complete(slot);
}

void mbarrier_wait_parity(int line, void* bar, unsigned int parity) {
  for (;;) {
    const size_t slot = mbarrier_slot(line, bar, "mbarrier.try_wait.parity");
    const MBarrier& m = S.mbarriers[slot];
    // try_wait.parity(P) succeeds when the current phase's parity is not P: the
    // latest phase of parity P has completed (and with it every earlier one).
    if ((m.phase & 1u) != (parity & 1u)) {
      mbarrier_observe(slot, m.phase);
      return;
    }
    Fiber& f = S.fibers[g_thread->tid];
    f.wait_slot = static_cast<int>(slot);
    f.wait_parity = parity;
    yield(State::kAtMbarrier, line);
    f.wait_slot = -1;
  }
}

void fence_proxy_async(int) { S.fibers[g_thread->tid].fence_epoch = S.epoch; }

void tma_load_2d(int line, void* smem_dst, const TensorMap2d& map, int x, int y, void* bar) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(smem_dst);
  const size_t row_bytes = static_cast<size_t>(map.box[0]) * map.elem_bytes;
  const size_t n = row_bytes * map.box[1];
  size_t off = 0;
  if (!shared_index(a, &off) || (off < shared_bytes() && off + n > shared_bytes()))
    abort_block(format("%s: line %d: bulk tensor copy destination is not shared memory", where().c_str(), line));
  if (a % 128 != 0)
    abort_block(format("%s: line %d: bulk tensor copy destination at shared offset %zu is not 128-byte aligned",
                       where().c_str(), line, off));
  if (map.box[0] == 0 || map.box[1] == 0 || map.box[0] > 256 || map.box[1] > 256 || row_bytes % 16 != 0 ||
      map.row_stride_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(map.base) % 16 != 0 || map.dims[0] == 0 ||
      map.dims[1] == 0)
    abort_block(format("%s: line %d: invalid tensor map (box %u x %u, stride %llu bytes, dims %llu x %llu)",
                       where().c_str(), line, map.box[0], map.box[1],
                       static_cast<unsigned long long>(map.row_stride_bytes),
                       static_cast<unsigned long long>(map.dims[0]), static_cast<unsigned long long>(map.dims[1])));
  check_dynamic_extent(off, n, "bulk tensor copy");
  const size_t slot = mbarrier_slot(line, bar, "bulk tensor copy");
  MBarrier& m = S.mbarriers[slot];
  // At issue, as for cp.async: no other thread may have touched the bytes since
  // the last barrier, no copy into them may still be pending, and generic-proxy
  // accesses before the barrier need this thread's fence.proxy.async after it.
  const Fiber& me_f = S.fibers[g_thread->tid];
  const uint16_t me = static_cast<uint16_t>(g_thread->tid + 1);
  bool generic = false;
  for (size_t i = 0; i < n; ++i) {
    const Shadow& s = S.shadow[off + i];
    if (s.inflight)
      abort_block(format("%s: line %d: bulk tensor copy into shared offset %zu while thread %d's cp.async into it is "
                         "in flight", where().c_str(), line, off + i, s.inflight - 1));
    if (s.tma_bar != 0 && S.mbarriers[s.tma_bar - 1u].phase <= s.tma_phase)
      abort_block(format("%s: line %d: bulk tensor copy into shared offset %zu while an earlier bulk copy into it "
                         "has not completed", where().c_str(), line, off + i));
    if (s.writer != 0 && s.writer != kAsyncProxy && s.writer != me && s.write_epoch == S.epoch)
      abort_block(format("%s: line %d: shared race: bulk tensor copy into shared offset %zu, written by thread %d "
                         "since the last __syncthreads", where().c_str(), line, off + i, s.writer - 1));
    if (s.read_epoch == S.epoch && s.reader != 0 && (s.many_readers || s.reader != me))
      abort_block(format("%s: line %d: shared race: bulk tensor copy into shared offset %zu, read by thread %d since "
                         "the last __syncthreads (a stage refilled before every thread is done with it)",
                         where().c_str(), line, off + i, s.reader - 1));
    generic = generic || (s.writer != 0 && s.writer != kAsyncProxy) || s.reader != 0;
  }
  if (generic && me_f.fence_epoch != static_cast<int64_t>(S.epoch))
    abort_block(format("%s: line %d: bulk tensor copy (async proxy) into shared offset %zu, which the generic proxy "
                       "accessed, without a fence.proxy.async by this thread after the last __syncthreads",
                       where().c_str(), line, off));
  // The box: element (x + i, y + j) of the tensor, zero outside [0, dims).
  std::vector<char> box(n, 0);
  for (uint32_t j = 0; j < map.box[1]; ++j) {
    const int64_t gy = static_cast<int64_t>(y) + j;
    if (gy < 0 || static_cast<uint64_t>(gy) >= map.dims[1]) continue;
    const int64_t lo = std::max<int64_t>(x, 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(x) + map.box[0], static_cast<int64_t>(map.dims[0]));
    if (lo >= hi) continue;
    const char* src = static_cast<const char*>(map.base) + gy * map.row_stride_bytes + lo * map.elem_bytes;
    const size_t bytes = static_cast<size_t>(hi - lo) * map.elem_bytes;
    check_global(reinterpret_cast<uintptr_t>(src), bytes, false);
    std::memcpy(box.data() + j * row_bytes + (lo - x) * map.elem_bytes, src, bytes);
  }
  std::memcpy(shared_at(off), box.data(), n);
  S.touched_lo = std::min(S.touched_lo, off);
  S.touched_hi = std::max(S.touched_hi, off + n);
  for (size_t i = 0; i < n; ++i) {
    Shadow& s = S.shadow[off + i];
    s.writer = kAsyncProxy;
    s.write_epoch = kNoEpoch;
    s.reader = 0;
    s.many_readers = false;
    s.tma_bar = static_cast<uint16_t>(slot + 1);
    s.tma_phase = m.phase;
  }
  m.copied_phase = m.phase;
  m.copy_line = line;
  // complete_tx: the emulation wants the bytes expected (arrive.expect_tx) first.
  if (m.tx < static_cast<int64_t>(n))
    abort_block(format("%s: line %d: bulk tensor copy of %zu bytes completes on an mbarrier phase that expects only "
                       "%lld more (arrive.expect_tx)", where().c_str(), line, n, static_cast<long long>(m.tx)));
  m.tx -= static_cast<int64_t>(n);
  mbarrier_maybe_complete(slot);
}

void cp_async_commit(int) { ++S.fibers[g_thread->tid].commits; }

// cp.async.wait_group `pending`: every copy of this thread's committed groups
// but the newest `pending` ones lands now, as this thread's write.
void cp_async_wait(int, int pending) {
  Fiber& f = S.fibers[g_thread->tid];
  const int done_below = f.commits - pending;  // groups [0, done_below) complete
  std::vector<PendingCopy> keep;
  for (const PendingCopy& c : f.pending) {
    if (c.group >= done_below) {
      keep.push_back(c);
      continue;
    }
    for (size_t i = 0; i < 16; ++i) S.shadow[c.offset + i].inflight = 0;
    check_shared(c.offset, 16, true);
    std::memcpy(shared_at(c.offset), &c.data, 16);
  }
  f.pending.swap(keep);
}

// ---- the memory checker (called by the hooks below) ----

static void check_shared(size_t off, size_t n, bool write) {
  check_dynamic_extent(off, n, write ? "shared write" : "shared read");
  const uint16_t me = static_cast<uint16_t>(g_thread->tid + 1);
  S.touched_lo = std::min(S.touched_lo, off);
  S.touched_hi = std::max(S.touched_hi, off + n);
  for (size_t i = 0; i < n; ++i) {
    Shadow& s = S.shadow[off + i];
    if (s.inflight)
      abort_block(format("%s: shared %s of %zu bytes at shared offset %zu while thread %d's cp.async into it is in "
                         "flight (its cp.async.wait_group has not covered the copy)", where().c_str(),
                         write ? "write" : "read", n, off, s.inflight - 1));
    if (s.tma_bar != 0) {
      const std::vector<uint32_t>& seen = S.fibers[g_thread->tid].observed;
      const size_t slot = s.tma_bar - 1u;
      if (slot >= seen.size() || seen[slot] <= s.tma_phase)
        abort_block(format("%s: shared %s of %zu bytes at shared offset %zu before this thread observed the "
                           "completion of the bulk tensor copy into it (mbarrier at shared offset %zu, phase %u: no "
                           "mbarrier wait)", where().c_str(), write ? "write" : "read", n, off,
                           S.mbarriers[slot].offset, s.tma_phase));
      if (write) s.tma_bar = 0;
    }
    if (!write) {
      if (s.writer == 0)
        abort_block(format("%s: shared read of %zu bytes at shared offset %zu: never written in this block "
                           "(poisoned)", where().c_str(), n, off));
      if (s.writer != me && s.write_epoch == S.epoch)
        abort_block(format("%s: shared race: read of %zu bytes at shared offset %zu written by thread %d since the "
                           "last __syncthreads", where().c_str(), n, off, s.writer - 1));
      if (s.read_epoch == S.epoch && s.reader != 0 && s.reader != me) s.many_readers = true;
      else if (s.read_epoch != S.epoch || s.reader == 0) s.many_readers = false;
      s.reader = me;
      s.read_epoch = S.epoch;
    } else {
      if (s.writer != 0 && s.writer != me && s.write_epoch == S.epoch)
        abort_block(format("%s: shared race: write of %zu bytes at shared offset %zu also written by thread %d since "
                           "the last __syncthreads", where().c_str(), n, off, s.writer - 1));
      if (s.read_epoch == S.epoch && s.reader != 0 && (s.many_readers || s.reader != me))
        abort_block(format("%s: shared race: write of %zu bytes at shared offset %zu read by thread %d since the last "
                           "__syncthreads", where().c_str(), n, off, s.reader - 1));
      s.writer = me;
      s.write_epoch = S.epoch;
    }
  }
}

static void check_global(uintptr_t a, size_t n, bool write) {
  const Tensor* below = nullptr;
  const Tensor* above = nullptr;
  for (Tensor& t : S.tensors) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(t.base);
    if (a >= lo && a + n <= lo + t.bytes) {
      if (S.programmatic && !S.fibers[g_thread->tid].dependency_waited && t.name != "weight")
        abort_block(format("%s: %s of %zu bytes of tensor '%s' before griddepcontrol.wait in a programmatic dependent "
                           "launch (the previous kernel may still be writing it)", where().c_str(),
                           write ? "store" : "load", n, t.name.c_str()));
      if (write && !t.writable)
        abort_block(format("%s: store of %zu bytes into read-only tensor '%s' at byte offset %zu", where().c_str(), n,
                           t.name.c_str(), static_cast<size_t>(a - lo)));
      if (!write) t.loaded += n;
      return;
    }
    if (lo <= a && (below == nullptr || lo > reinterpret_cast<uintptr_t>(below->base))) below = &t;
    if (lo > a && (above == nullptr || lo < reinterpret_cast<uintptr_t>(above->base))) above = &t;
  }
  std::string msg = format("%s: out-of-bounds global %s of %zu bytes", where().c_str(), write ? "store" : "load", n);
  if (below)
    msg += format(" at byte offset %lld of tensor '%s' (%zu bytes)",
                  static_cast<long long>(a - reinterpret_cast<uintptr_t>(below->base)), below->name.c_str(),
                  below->bytes);
  if (above)
    msg += format("%s %lld bytes before tensor '%s'", below ? "," : " at",
                  static_cast<long long>(reinterpret_cast<uintptr_t>(above->base) - a), above->name.c_str());
  abort_block(msg);
}

static inline void check(const void* p, size_t n, bool write) {
  if (!S.in_kernel) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  size_t off = 0;
  if (shared_index(a, &off)) return check_shared(off, n, write);
  if (a - reinterpret_cast<uintptr_t>(S.arena) < kArenaSlot * (kArenaSlots + 1)) return check_global(a, n, write);
}

// ---- host side ----

void* arena_alloc(const char* name, size_t bytes, size_t align_offset, bool writable) {
  if (S.arena == nullptr) {
    void* p = mmap(nullptr, kArenaSlot * (kArenaSlots + 1), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return nullptr;
    S.arena = static_cast<char*>(p);
  }
  if (S.tensors.size() >= static_cast<size_t>(kArenaSlots) || bytes + align_offset + 4096 > kArenaSlot) return nullptr;
  char* slot = S.arena + kArenaSlot * (S.tensors.size() + 1);  // slot 0 stays a gap
  const size_t span = (bytes + align_offset + 4095) / 4096 * 4096;
  if (span && mprotect(slot, span, PROT_READ | PROT_WRITE) != 0) return nullptr;
  S.tensors.push_back(Tensor{name, slot + align_offset, bytes, writable, 0});
  return slot + align_offset;
}

void arena_reset() {
  for (size_t i = 0; i < S.tensors.size(); ++i) {
    char* slot = S.arena + kArenaSlot * (i + 1);
    const size_t span = (S.tensors[i].bytes + 256 + 4095) / 4096 * 4096;
    madvise(slot, span, MADV_DONTNEED);
    mprotect(slot, span, PROT_NONE);
  }
  S.tensors.clear();
}

void configure(bool scramble, uint64_t seed) {
  S.scramble = scramble;
  S.rng.seed(seed);
  S.noise_words = S.noise_logs = S.mma_ops = 0;
}

const char* last_error() { return S.error.c_str(); }
uint64_t shared_size() { return shared_bytes(); }

void* dynamic_shared() { return S.dynamic; }

// Each kernel's cudaFuncAttributeMaxDynamicSharedMemorySize, where it was set
// (0: not set; the driver then allows 48 KiB minus the static bytes).
std::map<const void*, size_t>& max_dynamic_table() {
  static std::map<const void*, size_t> table;
  return table;
}
void set_max_dynamic_shared(const void* fn, size_t bytes) { max_dynamic_table()[fn] = bytes; }
size_t max_dynamic_shared(const void* fn) {
  const auto found = max_dynamic_table().find(fn);
  return found == max_dynamic_table().end() ? 0 : found->second;
}
void reset_max_dynamic_shared() { max_dynamic_table().clear(); }

bool launch(const char* kernel, void (*entry)(void*), void* closure, dim3 grid, dim3 block, size_t dynamic_smem,
            const void* fn, size_t static_smem) {
  S.kernel = kernel;
  S.entry = entry;
  S.closure = closure;
  S.failed = false;
  S.error.clear();
  const int n = static_cast<int>(block.x * block.y * block.z);
  if (n <= 0 || n > kMaxThreads || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    S.failed = true;
    S.error = format("%s: invalid launch grid (%u,%u,%u) block (%u,%u,%u)", kernel, grid.x, grid.y, grid.z, block.x,
                     block.y, block.z);
    return false;
  }
  const size_t opt_in = max_dynamic_shared(fn);
  const size_t allowed = opt_in ? opt_in : (static_smem < 48 * 1024 ? 48 * 1024 - static_smem : 0);
  if (dynamic_smem > allowed) {
    S.failed = true;
    S.error = format("%s: invalid argument (as cudaLaunchKernelEx): %zu static + %zu dynamic bytes of shared memory "
                     "exceed the 48 KiB default and cudaFuncAttributeMaxDynamicSharedMemorySize is %s%zu",
                     kernel, static_smem, dynamic_smem, opt_in ? "" : "unset: ", allowed);
    return false;
  }
  if (dynamic_smem > kMaxDynamicShared) {
    S.failed = true;
    S.error = format("%s: invalid launch: %zu bytes of dynamic shared memory (at most %zu)", kernel, dynamic_smem,
                     kMaxDynamicShared);
    return false;
  }
  if (S.dynamic == nullptr) {  // poisoned from the start, like the static section (zeros there: touched first)
    S.dynamic = static_cast<char*>(mmap(nullptr, kMaxDynamicShared, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    std::memset(S.dynamic, 0xA5, kMaxDynamicShared);
  }
  S.dynamic_bytes = dynamic_smem;
  if (S.stacks == nullptr) {
    S.stacks = static_cast<char*>(mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    S.fibers.resize(kMaxThreads);
  }
  S.nthreads = n;
  S.warps.assign((n + 31) / 32, WarpSync{});
  S.shadow.resize(shared_bytes() + kMaxDynamicShared);
  g_launch.block_dim = block;
  g_launch.grid_dim = grid;
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back(uint3{x, y, z});
  if (S.scramble) std::shuffle(blocks.begin(), blocks.end(), S.rng);
  for (const uint3& b : blocks) {
    g_launch.block_idx = b;
    if (!run_block()) return false;
  }
  return true;
}

// Bytes the kernels loaded from the tensors named `name` since they were allocated.
uint64_t bytes_loaded(const char* name) {
  uint64_t n = 0;
  for (const Tensor& t : S.tensors)
    if (t.name == name) n += t.loaded;
  return n;
}

void count(Count what) { ++(what == Count::kNoiseWords ? S.noise_words : S.noise_logs); }

void stats(uint64_t out[7]) {
  out[0] = S.blocks_run;
  out[1] = S.barriers;
  out[2] = S.collectives;
  out[3] = shared_bytes();
  out[4] = S.noise_words;
  out[5] = S.noise_logs;
  out[6] = S.mma_ops;
}

}  // namespace emu

// ---- the -fsanitize=thread instrumentation hooks of the kernel translation unit ----
#define LAM_EMU_HOOK(n)                                                                             \
  extern "C" void __tsan_read##n(void* p) { emu::check(p, n, false); }                             \
  extern "C" void __tsan_write##n(void* p) { emu::check(p, n, true); }                             \
  extern "C" void __tsan_unaligned_read##n(void* p) { emu::check(p, n, false); }                   \
  extern "C" void __tsan_unaligned_write##n(void* p) { emu::check(p, n, true); }                   \
  extern "C" void __tsan_volatile_read##n(void* p) { emu::check(p, n, false); }                    \
  extern "C" void __tsan_volatile_write##n(void* p) { emu::check(p, n, true); }
LAM_EMU_HOOK(1)
LAM_EMU_HOOK(2)
LAM_EMU_HOOK(4)
LAM_EMU_HOOK(8)
LAM_EMU_HOOK(16)
#undef LAM_EMU_HOOK
extern "C" void __tsan_read_range(void* p, unsigned long n) { emu::check(p, n, false); }
extern "C" void __tsan_write_range(void* p, unsigned long n) { emu::check(p, n, true); }
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}

// ---- kernel names, launches, and the C ABI of the runtime ----

namespace emu {
namespace {
std::map<const void*, std::string> g_names;
std::string g_launched;
}  // namespace

void name_kernel(const void* kernel, const char* pretty) {
  // "const char* ...kernel_name() [with auto Kernel = X]" -> "X"
  std::string s = pretty;
  const size_t at = s.find("Kernel = ");
  if (at != std::string::npos) s = s.substr(at + 9, s.size() - at - 10);
  const std::string ns = "localargmax::cuda::{anonymous}::";
  for (size_t i; (i = s.find(ns)) != std::string::npos;) s.erase(i, ns.size());
  g_names[kernel] = s;
}
bool kernels_named() { return !g_names.empty(); }
void note_launch(const void* kernel, const char* family) {
  const auto it = g_names.find(kernel);
  if (!g_launched.empty()) g_launched += ";";
  g_launched += it == g_names.end() ? std::string(family) + "<?>" : it->second;
}

}  // namespace emu

extern "C" {
void* lam_emu_alloc(const char* name, uint64_t bytes, uint64_t align_offset, int writable) {
  return emu::arena_alloc(name, bytes, align_offset, writable != 0);
}
void lam_emu_reset(int scramble, uint64_t seed) {
  emu::arena_reset();
  emu::configure(scramble != 0, seed);
  emu::g_launched.clear();
  emu::reset_max_dynamic_shared();
}
const char* lam_emu_last_error() { return emu::last_error(); }
const char* lam_emu_launched() { return emu::g_launched.c_str(); }
void lam_emu_stats(uint64_t* out) { emu::stats(out); }
uint64_t lam_emu_bytes_loaded(const char* name) { return emu::bytes_loaded(name); }
}
