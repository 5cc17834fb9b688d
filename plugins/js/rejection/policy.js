// The `rejection` acceptance policy in JavaScript: the twin of
// plugins/rust/rejection (semantics: specd_policy_logic::Rejection in
// plugins/logic/src/lib.rs).
//
// Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): draft i is
// accepted iff uniform * q < p, i.e. with probability min(1, p/q); the first
// rejected position is corrected from the residual norm(max(0, p - q)), which
// the host samples.  Config: {} (no keys).
//
// The WIT's p, q and uniform are f32; JavaScript computes in f64, where the
// product of two f32 is exact.  The Rust twin rounds the product to f32
// before comparing, so this does too (Math.fround), or a product just below p
// that rounds up to p would be accepted here and rejected there.
//
// componentize-js implements the WIT interface `acceptance` by the exported
// object `acceptance` and its resource `acceptor` by the class `Acceptor`;
// a variant is {tag, val}.  Build: scripts/build-js-plugins.sh.

function parseEmptyConfig(config) {
  const text = config.trim() ? config : "{}";
  const bad = (why) => `bad config ${JSON.stringify(config)}: ${why}`;
  if (!text.trimStart().startsWith("{")) throw bad("expected a JSON object");
  let obj;
  try {
    obj = JSON.parse(text);
  } catch (e) {
    throw bad(String(e.message));
  }
  const keys = Object.keys(obj);
  if (keys.length > 0) throw bad(`unknown field \`${keys[0]}\`, there are no fields`);
}

class Acceptor {
  static create(config, vocabSize) {
    parseEmptyConfig(config);
    return new Acceptor();
  }

  decide(positions) {
    for (let i = 0; i < positions.length; i++) {
      const pos = positions[i];
      if (Math.fround(pos.uniform * pos.q) >= pos.p) {
        return { accepted: i, correction: { tag: "residual" } };
      }
    }
    return { accepted: positions.length, correction: { tag: "residual" } };
  }
}

export const acceptance = { Acceptor };
