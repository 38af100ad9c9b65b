//! Chat-template rendering with minijinja, following Hugging Face conventions
//! (`messages`, `bos_token`, `eos_token`, `add_generation_prompt`, `raise_exception`).

use minijinja::{Environment, ErrorKind};
use serde_json::Value;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Compile(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// A compiled chat template with its special-token strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| TemplateError::Compile(e.to_string()))?;
        Ok(ChatTemplate { env, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages` (already normalized to string content) to the prompt text.
    pub fn render(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tmpl = self.env.get_template(NAME).map_err(|e| TemplateError::Render(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            add_generation_prompt => add_generation_prompt,
        })
        .map_err(|e| TemplateError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_hf_style_template_with_pycompat_methods() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}[{{ m.role|upper }}]{{ m.content.strip() }}\
             {% endfor %}{% if add_generation_prompt %}[A]{% endif %}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let msgs = [json!({"role":"user","content":"  hi  "})];
        assert_eq!(t.render(&msgs, true).unwrap(), "<s>[USER]hi[A]");
        assert_eq!(t.render(&msgs, false).unwrap(), "<s>[USER]hi");
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], true).unwrap_err();
        assert!(err.to_string().contains("no system role"));
    }

    #[test]
    fn bad_template_is_a_compile_error() {
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TemplateError::Compile(_))));
    }
}
