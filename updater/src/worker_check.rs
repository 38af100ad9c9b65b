//! What checking a worker found ([`crate::alignment`]): its verdict and what its `/v1/models`
//! serves, kept per worker by [`crate::state::State`].

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlignmentVerdict {
    Compatible,
    Incompatible(String),
    /// The worker could not be asked (down, timeout): the previous verdict stands.
    Unknown(String),
}

/// What a worker's `/v1/models` says it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedModels {
    /// Its base model: the first entry without a `parent` that is a configured model, else
    /// the first entry without a `parent` (`None` past the name bound, or without any).
    pub base: Option<String>,
    /// Its LoRA adapters (entries whose `parent` is a base model), sorted, at most
    /// [`crate::limits::AdapterLimits::max_adapters`] of them.
    pub adapters: Vec<String>,
    /// Adapters left out past the count bound.
    pub adapters_cut: u64,
    /// Names left out for being longer than the name bound.
    pub names_too_long: u64,
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlignmentOutcome {
    pub verdict: AlignmentVerdict,
    /// What `/v1/models` listed, when it answered.
    pub served: Option<ServedModels>,
    /// The block size in `vllm:cache_config_info`, when the check got that far.
    pub announced_block_size: Option<u32>,
}
