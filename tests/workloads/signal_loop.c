/* signal_loop N: N SIGALRMs (every 5 ms), each interrupting pause(): every rt_sigreturn then
 * restores pause's -EINTR into the return register. */
#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t got;

static void on_alarm(int sig) {
    (void)sig;
    got++;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 5000}, {0, 5000}};
    setitimer(ITIMER_REAL, &it, NULL);
    while (got < n) pause();
    return 0;
}
