// emu_fibers.h: the block scheduler of the host emulations whose kernels synchronise
// (__syncthreads, warp shuffles): every thread of a block is a fiber, and emu.h's barriers
// yield to the next fiber until all have arrived. Include after emu.h and kernels.inc.
#include <csetjmp>
#include <functional>
#include <vector>

// Fibers start through makecontext and then switch with _setjmp/_longjmp, which, unlike
// swapcontext, do not save and restore the signal mask with a system call per switch.
static ucontext_t sched_ctx;
static jmp_buf sched_jb;
static std::vector<ucontext_t> fibers;
struct fiber_jmp {
    jmp_buf b;
};
static std::vector<fiber_jmp> fiber_jb;
static std::vector<char> started, done;
static int current;
static const std::function<void()>* kernel_body;

void emu_yield() {
    if (!_setjmp(fiber_jb[current].b)) _longjmp(sched_jb, 1);
}
static void fiber_entry() {
    (*kernel_body)();
    done[current] = 1;
    _longjmp(sched_jb, 1);
}

// emu_launch_xy runs body for every block of a gx x gy grid of tx x ty threads with shared
// bytes of dynamic shared memory, filled with NaN before each block so that a read of a value
// no thread staged shows in the results. emu.h's warp built-ins index warps by threadIdx.x, so
// kernels that use them need ty 1 and tx a multiple of 32.
static void emu_launch_xy(unsigned gx, unsigned gy, unsigned tx, unsigned ty, size_t shared, const std::function<void()>& body) {
    const unsigned T = tx * ty;
    blockDim = {tx, ty, 1};
    std::vector<float> sm(shared / 4 + 1);
    emu_smem = sm.data();
    kernel_body = &body;
    std::vector<std::vector<char>> stacks(T, std::vector<char>(256 << 10));
    fibers.assign(T, ucontext_t{});
    fiber_jb.resize(T);
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            std::fill(sm.begin(), sm.end(), NAN);
            emu_block = emu_barrier{(int)T, 0, 0};
            for (unsigned w = 0; w < (T + 31) / 32 && w < 32; w++) emu_warp[w] = emu_barrier{32, 0, 0};
            done.assign(T, 0);
            started.assign(T, 0);
            for (unsigned t = 0; t < T; t++) {
                getcontext(&fibers[t]);
                fibers[t].uc_stack.ss_sp = stacks[t].data();
                fibers[t].uc_stack.ss_size = stacks[t].size();
                fibers[t].uc_link = &sched_ctx;
                makecontext(&fibers[t], fiber_entry, 0);
            }
            blockIdx = {bx, by, 0};
            for (bool running = true; running;) {
                running = false;
                for (unsigned t = 0; t < T; t++) {
                    if (done[t]) continue;
                    running = true;
                    current = t;
                    threadIdx = {t % tx, t / tx, 0};
                    if (_setjmp(sched_jb)) continue;  // the fiber yielded or finished
                    if (!started[t]) {
                        started[t] = 1;
                        setcontext(&fibers[t]);
                    }
                    _longjmp(fiber_jb[t].b, 1);
                }
            }
        }
}

// emu_launch is emu_launch_xy for blocks of T threads (a multiple of 32) in one dimension.
static void emu_launch(unsigned gx, unsigned gy, unsigned T, size_t shared, const std::function<void()>& body) {
    emu_launch_xy(gx, gy, T, 1, shared, body);
}
