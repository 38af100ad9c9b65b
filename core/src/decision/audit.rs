//! The prediction audit: what kvroute expected a worker to reuse versus what it reported.

use crate::decision::cost::reusable_tokens;

/// Outcome of one prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditClass {
    /// Predicted reuse and the worker reused exactly that much.
    HitAsPredicted,
    /// Predicted more than the worker reused (stale, evicted, or misaligned config).
    FalseHit,
    /// The worker reused more than predicted (knowledge lag).
    FalseMiss,
    /// Nothing predicted, nothing reused.
    OrdinaryMiss,
}

impl AuditClass {
    pub fn name(self) -> &'static str {
        match self {
            AuditClass::HitAsPredicted => "hit_as_predicted",
            AuditClass::FalseHit => "false_hit",
            AuditClass::FalseMiss => "false_miss",
            AuditClass::OrdinaryMiss => "ordinary_miss",
        }
    }
}

/// What the engine can report as cached for a prediction of `predicted` tokens: the engine
/// recomputes at least the prompt's last token (see [`crate::decision::cost::reusable_blocks`]), so no
/// prediction is met by more than `floor((n - 1) / block)` blocks. Predictions made before
/// the cost model applied that rule (older records) are held to it here too.
pub fn expected_cached(predicted: u64, prompt_tokens: u64, block_size: u32) -> u64 {
    predicted.min(reusable_tokens(prompt_tokens, block_size))
}

/// Signed prediction error in tokens: reported minus expected ([`expected_cached`]). Negative
/// where kvroute promised more than the worker reused, positive where it reused more.
pub fn prediction_error(predicted: u64, actual: u64, prompt_tokens: u64, block_size: u32) -> i64 {
    let expected = expected_cached(predicted, prompt_tokens, block_size);
    let diff = i128::from(actual) - i128::from(expected);
    i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
}

/// Classifies a prediction against what the worker reported, after the engine's last-token
/// rule ([`expected_cached`]).
pub fn classify(predicted: u64, actual: u64, prompt_tokens: u64, block_size: u32) -> AuditClass {
    let expected = expected_cached(predicted, prompt_tokens, block_size);
    match (expected, actual) {
        (0, 0) => AuditClass::OrdinaryMiss,
        _ if actual < expected => AuditClass::FalseHit,
        _ if actual > expected => AuditClass::FalseMiss,
        _ => AuditClass::HitAsPredicted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AuditClass::*;

    #[test]
    fn classes() {
        assert_eq!(classify(0, 0, 100, 16), OrdinaryMiss);
        assert_eq!(classify(0, 16, 100, 16), FalseMiss);
        assert_eq!(classify(64, 64, 100, 16), HitAsPredicted);
        assert_eq!(classify(64, 32, 100, 16), FalseHit);
        assert_eq!(classify(64, 80, 100, 16), FalseMiss);
        // Whole 96-token prompt predicted (an older record); the engine reuses 80 and
        // recomputes the last block.
        assert_eq!(classify(96, 80, 96, 16), HitAsPredicted);
        assert_eq!(classify(96, 64, 96, 16), FalseHit);
    }

    #[test]
    fn exact_multiples_of_the_block_size_show_no_error() {
        for blocks in 1..64u64 {
            let prompt = blocks * 16;
            let reported = (blocks - 1) * 16;
            // What the cost model predicts for a worker holding every block of the prompt.
            let predicted = reusable_tokens(prompt, 16);
            assert_eq!(predicted, reported);
            assert_eq!(prediction_error(predicted, reported, prompt, 16), 0);
            let class = classify(predicted, reported, prompt, 16);
            assert_eq!(class, if blocks == 1 { OrdinaryMiss } else { HitAsPredicted });
        }
    }

    #[test]
    fn a_prompt_of_one_block_or_less_is_never_a_hit() {
        // A 16-token prompt fully held: the engine reuses nothing.
        assert_eq!(classify(16, 0, 16, 16), OrdinaryMiss);
        assert_eq!(prediction_error(16, 0, 16, 16), 0);
        assert_eq!(classify(0, 0, 5, 16), OrdinaryMiss);
    }

    #[test]
    fn errors_are_signed() {
        assert_eq!(prediction_error(64, 32, 100, 16), -32);
        assert_eq!(prediction_error(32, 64, 100, 16), 32);
        assert_eq!(prediction_error(0, u64::MAX, 100, 16), i64::MAX);
    }
}
