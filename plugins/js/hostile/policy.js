// A hostile JavaScript policy for the host's containment tests
// (host/policy/tests/js_policies.rs): the JavaScript rewrite of the Rust
// suite's hostile cases.  The config picks the misbehaviour:
//
//   {"do": "loop"}            nextDraftLength never returns        -> timeout
//   {"do": "loop-create"}     create never returns                 -> timeout
//   {"do": "grow"}            nextDraftLength allocates forever    -> memory_limit
//   {"do": "throw"}           nextDraftLength throws               -> trap
//   {"do": "too-long"}        answers max-draft + 1                -> invalid_answer
//   {"do": "accept-too-many"} decide accepts one more than drafted -> invalid_answer
//   {"do": "bad-token"}       decide corrects with vocab-size      -> invalid_answer
//   {} (or anything else)     behaves: k = 2, accept everything
//
// It exports both interfaces (world `policy`).

function what(config) {
  return JSON.parse(config || "{}").do ?? "";
}

class Scheduler {
  constructor(todo) {
    this.todo = todo;
  }

  static create(config, carried) {
    const todo = what(config);
    if (todo === "loop-create") {
      for (;;) {}
    }
    return new Scheduler(todo);
  }

  nextDraftLength(input) {
    if (this.todo === "loop") {
      let n = 0;
      for (;;) n++;
    }
    if (this.todo === "grow") {
      // Growing fast: growing a few MiB at a time runs out of fuel first
      // (SpiderMonkey zeroes and collects: instructions too), a timeout
      // rather than the memory cap this case is about.
      const hoard = [];
      for (let n = 8 << 20; ; n *= 8) hoard.push(new Uint8Array(n));
    }
    if (this.todo === "throw") throw new Error("a JavaScript exception in nextDraftLength");
    if (this.todo === "too-long") return input.maxDraft + 1;
    return Math.min(2, input.maxDraft);
  }

  carry() {
    return undefined;
  }
}

class Acceptor {
  constructor(todo, vocabSize) {
    this.todo = todo;
    this.vocabSize = vocabSize;
  }

  static create(config, vocabSize) {
    return new Acceptor(what(config), vocabSize);
  }

  decide(positions) {
    if (this.todo === "accept-too-many") return { accepted: positions.length + 1, correction: { tag: "residual" } };
    if (this.todo === "bad-token") return { accepted: 0, correction: { tag: "token", val: this.vocabSize } };
    return { accepted: positions.length, correction: { tag: "residual" } };
  }
}

export const schedule = { Scheduler };
export const acceptance = { Acceptor };
