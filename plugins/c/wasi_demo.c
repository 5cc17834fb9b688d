// A test fixture, not a built-in: a schedule written against wasi-libc that
// prints with printf and tries to reach the outside (files, environment,
// clock).  Under specd's deny-all WASI it loads and runs, its output goes to
// the log, and every probe fails.  Its answer reports what it could reach:
//   k = 1 + 2 (a file opened) + 4 (an environment variable seen)
//         + 8 (the clock moved), clipped to max-draft.
// So a sandboxed run answers 1.  Round 1 also sleeps for an hour: time is
// frozen for policies, so the sleep returns at once.  A config
// `{"print": N}` makes `create` print N more bytes: far past the host's
// output cap, which must drop (and count) the rest, not fail the policy.
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

// N of a `"print": N` in the config, else 0.
static size_t bytes_asked(const schedule_policy_string_t *config) {
    const char *key = "\"print\":";
    size_t n = strlen(key);
    for (size_t i = 0; i + n <= config->len; i++) {
        if (memcmp(config->ptr + i, key, n) != 0) continue;
        size_t v = 0;
        for (size_t j = i + n; j < config->len; j++) {
            char c = (char)config->ptr[j];
            if (c == ' ') continue;
            if (c < '0' || c > '9') break;
            v = v * 10 + (size_t)(c - '0');
        }
        return v;
    }
    return 0;
}

// Prints n bytes of 64-byte lines, 4 KiB at a time (cheap in fuel).
static void print_bytes(size_t n) {
    static char chunk[4096];
    for (size_t i = 0; i < sizeof chunk; i += 64) {
        memset(chunk + i, '.', 63);
        chunk[i + 63] = '\n';
    }
    for (size_t done = 0; done < n;) {
        size_t take = n - done < sizeof chunk ? n - done : sizeof chunk;
        fwrite(chunk, 1, take, stdout);
        done += take;
    }
}

bool exports_specd_policy_schedule_static_scheduler_create(schedule_policy_string_t *config,
                                                           schedule_policy_list_u8_t *maybe_carried,
                                                           exports_specd_policy_schedule_own_scheduler_t *ret,
                                                           schedule_policy_string_t *err) {
    (void)err;
    printf("wasi-demo: hello from C, config %.*s\n", (int)config->len, (const char *)config->ptr);
    print_bytes(bytes_asked(config));
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
