// A test fixture, not a built-in: a schedule written against wasi-libc that
// prints with printf and tries to reach the outside (files, environment,
// clock).  Under specd's deny-all WASI it loads and runs, its output goes to
// the log, and every probe fails.  Its answer reports what it could reach:
//   k = 1 + 2 (a file opened) + 4 (an environment variable seen)
//         + 8 (the clock moved), clipped to max-draft.
// So a sandboxed run answers 1.  Round 1 also sleeps for an hour: time is
// frozen for policies, so the sleep returns at once.
#include "schedule_policy.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct exports_specd_policy_schedule_scheduler_t {
    uint32_t reached;
};

static uint32_t probe(void) {
    uint32_t reached = 0;
    const char *files[] = {"/etc/passwd", "/etc/hostname", "Cargo.toml", "./README.md", "/proc/self/environ"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        FILE *f = fopen(files[i], "r");
        if (f) {
            reached |= 2;
            fclose(f);
        }
    }
    DIR *d = opendir("/");
    if (d) {
        reached |= 2;
        closedir(d);
    }
    if (getenv("HOME") || getenv("PATH")) reached |= 4;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0 && (ts.tv_sec != 0 || ts.tv_nsec != 0)) reached |= 8;
    if (time(NULL) != 0) reached |= 8;
    return reached;
}

bool exports_specd_policy_schedule_static_scheduler_create(schedule_policy_string_t *config,
                                                           schedule_policy_list_u8_t *maybe_carried,
                                                           exports_specd_policy_schedule_own_scheduler_t *ret,
                                                           schedule_policy_string_t *err) {
    (void)err;
    printf("wasi-demo: hello from C, config %.*s\n", (int)config->len, (const char *)config->ptr);
    fflush(stdout);
    schedule_policy_string_free(config);
    if (maybe_carried) schedule_policy_list_u8_free(maybe_carried);
    exports_specd_policy_schedule_scheduler_t *s = malloc(sizeof *s);
    if (!s) abort();
    s->reached = probe();
    fprintf(stderr, "wasi-demo: probes reached mask %u\n", (unsigned)s->reached);
    *ret = exports_specd_policy_schedule_scheduler_new(s);
    return true;
}

uint32_t exports_specd_policy_schedule_method_scheduler_next_draft_length(
    exports_specd_policy_schedule_borrow_scheduler_t self, exports_specd_policy_schedule_schedule_input_t *input) {
    uint32_t max = input->max_draft, round = input->round;
    exports_specd_policy_schedule_schedule_input_free(input);
    if (round == 1) sleep(3600);
    uint32_t k = 1 + (self->reached | probe());
    printf("wasi-demo: round %u -> k %u\n", (unsigned)round, (unsigned)k);
    fflush(stdout);
    return k < max ? k : max;
}

bool exports_specd_policy_schedule_method_scheduler_carry(exports_specd_policy_schedule_borrow_scheduler_t self,
                                                          schedule_policy_list_u8_t *ret) {
    (void)self;
    (void)ret;
    return false;
}

void exports_specd_policy_schedule_scheduler_destructor(exports_specd_policy_schedule_scheduler_t *rep) {
    free(rep);
}
