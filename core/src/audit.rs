//! The prediction audit: what kvroute expected a worker to reuse versus what it reported.

/// Outcome of one prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditClass {
    /// Predicted reuse and the worker reused at least that much.
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

/// Classifies a prediction. Engines recompute the last prompt token even when every block is
/// cached, so a prediction covering the whole block-aligned prompt is met by one block less.
pub fn classify(predicted: u64, actual: u64, prompt_tokens: u64, block_size: u32) -> AuditClass {
    let bs = u64::from(block_size);
    let whole_prompt = predicted > 0 && predicted + bs > prompt_tokens;
    let needed = if whole_prompt { predicted.saturating_sub(bs) } else { predicted };
    match (predicted, actual) {
        (0, 0) => AuditClass::OrdinaryMiss,
        (0, _) => AuditClass::FalseMiss,
        _ if actual < needed => AuditClass::FalseHit,
        _ if actual > predicted => AuditClass::FalseMiss,
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
        // Whole 96-token prompt predicted; the engine reuses 80 and recomputes the last block.
        assert_eq!(classify(96, 80, 96, 16), HitAsPredicted);
        assert_eq!(classify(96, 64, 96, 16), FalseHit);
    }
}
