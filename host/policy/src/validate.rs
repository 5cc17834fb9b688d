//! The one check of every policy answer, WASM or native: an answer outside
//! the contract is an `invalid_answer` error, never clamped into range.

use crate::{Correction, Decision, PolicyError, PolicyErrorKind, ScheduleInput};

/// A schedule's k: at most `input.max_draft`.
pub fn draft_length(policy: &str, k: u32, input: &ScheduleInput) -> Result<u32, PolicyError> {
    if k <= input.max_draft {
        return Ok(k);
    }
    Err(PolicyError::new(
        policy,
        PolicyErrorKind::InvalidAnswer,
        format!(
            "next-draft-length answered {k}, above max-draft {}",
            input.max_draft
        ),
    ))
}

/// An acceptance decision over `drafted` positions: at most `drafted`
/// accepted, an explicit correction token inside the vocabulary.
pub fn decision(
    policy: &str,
    d: Decision,
    drafted: usize,
    vocab_size: u32,
) -> Result<Decision, PolicyError> {
    let invalid = |m: String| Err(PolicyError::new(policy, PolicyErrorKind::InvalidAnswer, m));
    if d.accepted as usize > drafted {
        return invalid(format!(
            "decide accepted {} of {drafted} drafted tokens",
            d.accepted
        ));
    }
    if let Correction::Token(t) = d.correction {
        if t >= vocab_size {
            return invalid(format!(
                "decide corrected with token {t}, outside the vocabulary of {vocab_size} tokens"
            ));
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_range_pass_and_others_are_invalid() {
        let input = ScheduleInput {
            max_draft: 4,
            ..Default::default()
        };
        assert_eq!(draft_length("p", 4, &input), Ok(4));
        let e = draft_length("p", 5, &input).unwrap_err();
        assert_eq!(e.kind, PolicyErrorKind::InvalidAnswer);
        assert!(e.message.contains("above max-draft 4"), "{e}");

        let ok = Decision {
            accepted: 2,
            correction: Correction::Token(9),
        };
        assert_eq!(decision("p", ok, 2, 10), Ok(ok));
        let too_many = Decision { accepted: 3, ..ok };
        assert!(decision("p", too_many, 2, 10)
            .unwrap_err()
            .message
            .contains("accepted 3 of 2"));
        let bad_token = decision("p", ok, 2, 9).unwrap_err();
        assert_eq!(bad_token.kind, PolicyErrorKind::InvalidAnswer);
        assert!(bad_token.message.contains("token 9"), "{bad_token}");
    }
}
