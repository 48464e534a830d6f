// Threads renamed while traced: "early_name" renames itself "late_name" (prctl) after 1.2 s,
// and the main thread renames "sleeper" "named_by_main" (pthread_setname_np: a write to
// /proc/self/task/TID/comm) at the same time; both live 1.5 s more. gputrace reads a live
// thread's name again only after a rename (task_rename), so both must show their new names.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *renames_itself(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "early_name");
    sleep_ms(1200);
    prctl(PR_SET_NAME, "late_name");
    sleep_ms(1500);
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "sleeper");
    sleep_ms(2700);
    return NULL;
}

int main(void) {
    pthread_t a, b;
    if (pthread_create(&a, NULL, renames_itself, NULL) || pthread_create(&b, NULL, sleeper, NULL))
        return 1;
    sleep_ms(1200);
    if (pthread_setname_np(b, "named_by_main")) return 1;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("renamed\n");
    return 0;
}
