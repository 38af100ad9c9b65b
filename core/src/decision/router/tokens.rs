//! A prompt's routing tokens, with chat prompts encoded through the thread's token cache.

use crate::decision::request::Prompt;
use crate::decision::tokenize::model::{ModelBundle, ModelError, RoutingTokens};

use super::{ModelPlan, Router};

impl Router {
    /// As [`ModelBundle::routing_tokens`], but the rendered text of a chat prompt is encoded
    /// through the token cache.
    pub(super) fn routing_tokens(
        &self,
        m: &ModelPlan,
        bundle: &ModelBundle,
        prompt: &Prompt,
    ) -> Result<RoutingTokens, ModelError> {
        let Prompt::Chat(chat) = prompt else {
            return bundle.routing_tokens(prompt);
        };
        bundle.render_for_routing(chat)?.tokens(|text| match self.tokens.try_borrow_mut() {
            Ok(mut cache) => cache.encode(bundle, &m.cuts, text),
            Err(_) => bundle.encode(text, false),
        })
    }
}
