// A test fixture, not a built-in: a schedule that prints far more than the
// host keeps.  `create` prints the number of bytes its config asks for
// (`{"print": N}`, default 1 MiB) to stdout, each round prints a line, and
// it answers k = 3 (clipped to max-draft) every round.  The host keeps the
// first bytes for the log, counts the rest, and the policy must keep
// answering 3: printing too much is not a failure.
#include "schedule_policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct exports_specd_policy_schedule_scheduler_t {
    int unused;
};

static size_t bytes_asked(const schedule_policy_string_t *config) {
    const char *key = "\"print\":";
    size_t n = strlen(key);
    for (size_t i = 0; i + n <= config->len; i++) {
        if (memcmp(config->ptr + i, key, n) == 0) {
            size_t v = 0;
            for (size_t j = i + n; j < config->len; j++) {
                char c = (char)config->ptr[j];
                if (c == ' ') continue;
                if (c < '0' || c > '9') break;
                v = v * 10 + (size_t)(c - '0');
            }
            return v;
        }
    }
    return (size_t)1 << 20;
}

bool exports_specd_policy_schedule_static_scheduler_create(schedule_policy_string_t *config,
                                                           schedule_policy_list_u8_t *maybe_carried,
                                                           exports_specd_policy_schedule_own_scheduler_t *ret,
                                                           schedule_policy_string_t *err) {
    (void)err;
    size_t n = bytes_asked(config);
    schedule_policy_string_free(config);
    if (maybe_carried) schedule_policy_list_u8_free(maybe_carried);
    // 4 KiB of 64-byte lines, written over and over (cheap in fuel).
    static char chunk[4096];
    for (size_t i = 0; i < sizeof chunk; i += 64) {
        memset(chunk + i, '.', 63);
        memcpy(chunk + i, "chatty: ", 8);
        chunk[i + 63] = '\n';
    }
    for (size_t done = 0; done < n;) {
        size_t take = n - done < sizeof chunk ? n - done : sizeof chunk;
        fwrite(chunk, 1, take, stdout);
        done += take;
    }
    fflush(stdout);
    exports_specd_policy_schedule_scheduler_t *s = malloc(sizeof *s);
    if (!s) abort();
    *ret = exports_specd_policy_schedule_scheduler_new(s);
    return true;
}

uint32_t exports_specd_policy_schedule_method_scheduler_next_draft_length(
    exports_specd_policy_schedule_borrow_scheduler_t self, exports_specd_policy_schedule_schedule_input_t *input) {
    (void)self;
    uint32_t max = input->max_draft, round = input->round;
    exports_specd_policy_schedule_schedule_input_free(input);
    printf("chatty: round %u\n", (unsigned)round);
    fflush(stdout);
    return 3 < max ? 3 : max;
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
