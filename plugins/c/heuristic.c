// The `heuristic` schedule in C: the twin of plugins/rust/heuristic
// (semantics: specd_policy_logic::Heuristic).  Hugging Face's heuristic
// schedule: k starts at `initial` (config {"initial": 4}), +2 after a round
// whose drafts were all accepted, -1 otherwise (never below 1), kept within
// [1, max-draft]; k is carried across requests as 4 little-endian bytes.
//
// Bindings: `wit-bindgen c wit --world schedule-policy` (scripts/build-plugins.sh).
// Uses wasi-libc only for malloc/free/memcmp: the component imports nothing.
#include "schedule_policy.h"

#include <stdlib.h>
#include <string.h>

struct exports_specd_policy_schedule_scheduler_t {
    uint32_t k;
};

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

// Parses {"initial": <u32>} (the key optional, no other keys), like the Rust
// twin's serde config.  Returns NULL on success, an error message otherwise.
static const char *parse_config(const uint8_t *text, size_t len, uint32_t *initial) {
    const char *p = (const char *)text, *end = p + len;
    int seen = 0;
    p = skip_ws(p, end);
    if (p == end) return NULL;  // empty config = {}
    if (*p++ != '{') return "bad config: expected a JSON object";
    p = skip_ws(p, end);
    if (p < end && *p == '}') goto done;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p++ != '"') return "bad config: expected a key";
        const char *key = p;
        while (p < end && *p != '"' && *p != '\\') p++;
        if (p >= end || *p != '"') return "bad config: unsupported key";
        size_t klen = (size_t)(p - key);
        p++;
        if (klen != 7 || memcmp(key, "initial", 7) != 0) return "bad config: unknown field (expected `initial`)";
        if (seen++) return "bad config: duplicate field `initial`";
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':') return "bad config: expected ':'";
        p = skip_ws(p, end);
        if (p >= end || *p < '0' || *p > '9') return "bad config: initial must be a non-negative integer";
        uint64_t v = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            v = v * 10 + (uint64_t)(*p++ - '0');
            if (v > 0xffffffffu) return "bad config: initial out of range";
        }
        if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return "bad config: initial must be an integer";
        *initial = (uint32_t)v;
        p = skip_ws(p, end);
        if (p < end && *p == ',') { p++; continue; }
        if (p < end && *p == '}') break;
        return "bad config: expected ',' or '}'";
    }
done:
    p = skip_ws(p + 1, end);
    if (p != end) return "bad config: trailing characters";
    return NULL;
}

bool exports_specd_policy_schedule_static_scheduler_create(schedule_policy_string_t *config,
                                                           schedule_policy_list_u8_t *maybe_carried,
                                                           exports_specd_policy_schedule_own_scheduler_t *ret,
                                                           schedule_policy_string_t *err) {
    uint32_t initial = 4;
    const char *msg = parse_config(config->ptr, config->len, &initial);
    if (!msg && initial == 0) msg = "bad config: initial must be >= 1";
    uint32_t k = initial;
    if (!msg && maybe_carried && maybe_carried->len == 4) {
        const uint8_t *b = maybe_carried->ptr;
        k = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        if (k < 1) k = 1;
    }
    schedule_policy_string_free(config);
    if (maybe_carried) schedule_policy_list_u8_free(maybe_carried);
    if (msg) {
        schedule_policy_string_dup(err, msg);
        return false;
    }
    exports_specd_policy_schedule_scheduler_t *s = malloc(sizeof *s);
    if (!s) abort();
    s->k = k;
    *ret = exports_specd_policy_schedule_scheduler_new(s);
    return true;
}

uint32_t exports_specd_policy_schedule_method_scheduler_next_draft_length(
    exports_specd_policy_schedule_borrow_scheduler_t self, exports_specd_policy_schedule_schedule_input_t *input) {
    if (input->round > 0 && input->recent.len > 0) {
        const exports_specd_policy_schedule_round_record_t *last = &input->recent.ptr[input->recent.len - 1];
        if (last->drafted > 0) {
            if (last->accepted >= last->drafted)
                self->k = self->k > UINT32_MAX - 2 ? UINT32_MAX : self->k + 2;
            else
                self->k = self->k > 1 ? self->k - 1 : 1;
        }
    }
    uint32_t max = input->max_draft;
    exports_specd_policy_schedule_schedule_input_free(input);
    if (max == 0) return 0;
    if (self->k < 1) self->k = 1;
    if (self->k > max) self->k = max;
    return self->k;
}

bool exports_specd_policy_schedule_method_scheduler_carry(exports_specd_policy_schedule_borrow_scheduler_t self,
                                                          schedule_policy_list_u8_t *ret) {
    uint8_t *b = malloc(4);
    if (!b) abort();
    b[0] = (uint8_t)self->k;
    b[1] = (uint8_t)(self->k >> 8);
    b[2] = (uint8_t)(self->k >> 16);
    b[3] = (uint8_t)(self->k >> 24);
    ret->ptr = b;
    ret->len = 4;
    return true;
}

void exports_specd_policy_schedule_scheduler_destructor(exports_specd_policy_schedule_scheduler_t *rep) {
    free(rep);
}
