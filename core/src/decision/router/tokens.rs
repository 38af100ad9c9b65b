//! A prompt's routing tokens, with chat prompts rendered through the thread's render cache
//! and encoded through its token cache.

use serde_json::Value;

use crate::decision::request::Prompt;
use crate::decision::tokenize::model::{ModelBundle, ModelError, RenderedChat, RoutingTokens};

use super::{ModelPlan, Router};

impl Router {
    /// As [`ModelBundle::routing_tokens`], but a chat prompt without media is rendered through
    /// the render cache, and the rendered text is encoded through the token cache.
    pub(super) fn routing_tokens(
        &self,
        m: &ModelPlan,
        bundle: &ModelBundle,
        prompt: &Prompt,
    ) -> Result<RoutingTokens, ModelError> {
        let Prompt::Chat(chat) = prompt else {
            return bundle.routing_tokens(prompt);
        };
        let rendered = match (chat.media, self.renders.try_borrow_mut()) {
            (None, Ok(mut cache)) => {
                RenderedChat { text: cache.render(bundle, chat)?, after_media: None }
            }
            _ => bundle.render_for_routing(chat)?,
        };
        // A prompt that carries an earlier answer is a conversation under way: its next turn
        // repeats it (see the token cache's protected part). The answer is usually just before
        // the last message.
        let continued = chat
            .messages
            .iter()
            .rev()
            .any(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
        rendered.tokens(|text| match self.tokens.try_borrow_mut() {
            Ok(mut cache) if continued => cache.encode_continued(bundle, &m.cuts, text),
            Ok(mut cache) => cache.encode(bundle, &m.cuts, text),
            Err(_) => bundle.encode(text, false),
        })
    }
}
