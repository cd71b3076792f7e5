/*
 * Tries each socket family through every x86 entry point and prints one
 * line per try, `sock-ENTRY-FAMILY=created|refused|killedN`:
 *   native      the 64-bit socket(2)
 *   socketcall  int 0x80, the 32-bit socketcall(SYS_SOCKET, args)
 *   i386        int 0x80, the 32-bit socket(2) (nr 359)
 *   x32         the x32 ABI's socket(2) (nr 41 | 0x40000000)
 * Each try runs in a child, so a filter that kills the caller (SIGSYS) is
 * seen as `killed31`. Built static and non-PIE by tests/tests/sandbox_probes.rs
 * (`int 0x80` takes 32-bit pointers: the argument block is a global, below
 * 4 GiB in a non-PIE binary).
 */
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned int args32[3];

static long int80(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
    return ret;
}

static int attempt(int how, int family, int type, int proto) {
    long r;
    switch (how) {
    case 0:
        r = syscall(SYS_socket, family, type, proto);
        return r >= 0;
    case 1:
        args32[0] = family;
        args32[1] = type;
        args32[2] = proto;
        r = int80(102, 1, (long)(unsigned long)args32, 0);
        return r >= 0;
    case 2:
        r = int80(359, family, type, proto);
        return r >= 0;
    default:
        r = syscall(0x40000000L + 41, family, type, proto);
        return r >= 0;
    }
}

int main(void) {
    static const char *hows[] = {"native", "socketcall", "i386", "x32"};
    static const struct {
        const char *name;
        int family, type, proto;
    } fams[] = {
        {"vsock", 40, 1, 0},
        {"netlink_audit", 16, 3, 9},
        {"netlink_sock_diag", 16, 3, 4},
        {"netlink_uevent", 16, 3, 15},
        {"netlink_generic", 16, 3, 16},
        {"netlink_netfilter", 16, 3, 12},
        {"netlink_xfrm", 16, 3, 6},
        {"packet", 17, 3, 0},
        {"alg", 38, 5, 0},
        {"netlink_route", 16, 3, 0},
        {"inet", 2, 1, 0},
    };
    for (unsigned f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        for (int how = 0; how < 4; how++) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid < 0) {
                printf("sock-%s-%s=forkfailed\n", hows[how], fams[f].name);
                continue;
            }
            if (pid == 0)
                _exit(attempt(how, fams[f].family, fams[f].type, fams[f].proto) ? 0 : 1);
            int st = 0;
            waitpid(pid, &st, 0);
            if (WIFSIGNALED(st))
                printf("sock-%s-%s=killed%d\n", hows[how], fams[f].name, WTERMSIG(st));
            else
                printf("sock-%s-%s=%s\n", hows[how], fams[f].name,
                       WEXITSTATUS(st) == 0 ? "created" : "refused");
        }
    }
    return 0;
}
