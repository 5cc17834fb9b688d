// The `heuristic` schedule in JavaScript: the twin of plugins/rust/heuristic
// (semantics: specd_policy_logic::Heuristic in plugins/logic/src/lib.rs).
//
// Hugging Face transformers' `num_assistant_tokens_schedule = "heuristic"`:
// k starts at `initial` (config {"initial": 4}); before every round but the
// first, the previous round updates it: +2 when every drafted token was
// accepted, -1 otherwise (never below 1); a round that drafted nothing changes
// nothing.  k is kept within [1, max-draft]; the answer is k (0 only when
// max-draft is 0).  k is carried across requests as 4 little-endian bytes.
//
// componentize-js implements the WIT interface `schedule` by the exported
// object `schedule`, its resource `scheduler` by the class `Scheduler`
// (methods in camelCase); a `result` export returns its ok value and throws
// its err value.  Build: scripts/build-js-plugins.sh.

const U32_MAX = 0xffffffff;

// The top-level members of a JSON object as [key, raw value text] pairs.
// JSON.parse cannot tell 4 from 4.0 nor see a duplicate key, and the Rust
// twin's serde config refuses both; the text is valid JSON (JSON.parse said
// so) when this runs, so it only has to find where each value ends.
function members(text) {
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const string = () => {
    const start = i++;
    while (text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const value = () => {
    ws();
    const start = i;
    const c = text[i];
    if (c === '"') {
      string();
    } else if (c === "{" || c === "[") {
      let depth = 0;
      do {
        if (text[i] === '"') {
          string();
          continue;
        }
        if (text[i] === "{" || text[i] === "[") depth++;
        if (text[i] === "}" || text[i] === "]") depth--;
        i++;
      } while (depth > 0);
    } else {
      while (i < text.length && !",}] \t\n\r".includes(text[i])) i++;
    }
    return text.slice(start, i);
  };
  const out = [];
  ws();
  i++; // {
  ws();
  while (text[i] !== "}") {
    const key = string();
    ws();
    i++; // :
    out.push([key, value()]);
    ws();
    if (text[i] === ",") {
      i++;
      ws();
    }
  }
  return out;
}

// `initial` from the JSON config, like the Rust twin's serde config: an
// object whose only (optional) key is `initial`, a u32 >= 1.  Throws the
// message for the client.
function parseConfig(config) {
  const text = config.trim() ? config : "{}";
  const bad = (why) => `bad config ${JSON.stringify(config)}: ${why}`;
  if (!text.trimStart().startsWith("{")) throw bad("expected a JSON object");
  try {
    JSON.parse(text);
  } catch (e) {
    throw bad(String(e.message));
  }
  let initial = 4;
  const seen = new Set();
  for (const [key, raw] of members(text)) {
    if (key !== "initial") throw bad(`unknown field \`${key}\`, expected \`initial\``);
    if (seen.has(key)) throw bad(`duplicate field \`${key}\``);
    seen.add(key);
    if (!/^-?(0|[1-9][0-9]*)$/.test(raw) || BigInt(raw) < 0n || BigInt(raw) > BigInt(U32_MAX)) {
      throw bad("initial must be an integer in 0..=4294967295");
    }
    initial = Number(raw);
  }
  if (initial === 0) throw "bad config: initial must be >= 1";
  return initial;
}

class Scheduler {
  constructor(k) {
    this.k = k;
  }

  static create(config, carried) {
    let k = parseConfig(config);
    if (carried !== undefined && carried !== null && carried.length === 4) {
      k = Math.max(new DataView(carried.buffer, carried.byteOffset, 4).getUint32(0, true), 1);
    }
    return new Scheduler(k);
  }

  nextDraftLength(input) {
    const recent = input.recent;
    if (input.round > 0 && recent.length > 0) {
      const last = recent[recent.length - 1];
      if (last.drafted > 0) {
        this.k = last.accepted >= last.drafted ? Math.min(this.k + 2, U32_MAX) : Math.max(this.k - 1, 1);
      }
    }
    if (input.maxDraft === 0) return 0;
    this.k = Math.min(Math.max(this.k, 1), input.maxDraft);
    return this.k;
  }

  carry() {
    const bytes = new Uint8Array(4);
    new DataView(bytes.buffer).setUint32(0, this.k, true);
    return bytes;
  }
}

export const schedule = { Scheduler };
