//! Chat-template rendering with minijinja, in the environment Hugging Face transformers gives
//! Jinja2 (`apply_chat_template`): `trim_blocks` and `lstrip_blocks` on, no trailing newline,
//! no auto-escaping; `tojson` is Python's `json.dumps(x, ensure_ascii=False)` (", " and ": "
//! separators, key order kept, Python float formatting) rather than Jinja's HTML-safe one;
//! `raise_exception(msg)` fails the render; `strftime_now(fmt)` formats the current time (UTC).
//! Values print as Python's `str()` does (`None`, `True`, `1.0`, `{'a': 1}`), string methods
//! follow Python (`strip()` with Python's whitespace set, `strip('\n')`, `split()`, ...).
//!
//! The context is what transformers passes: the tokenizer's special tokens (`bos_token`,
//! `eos_token`, ... when set), then the template kwargs, then `messages`, `tools`, `documents`
//! and `add_generation_prompt`.

mod incremental;
mod python;

use std::sync::Arc;

use minijinja::value::{Kwargs, Object, ObjectRepr, Rest};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde_json::{Map, Value as Json};
use thiserror::Error as ThisError;

use crate::decision::pyjson::special_number;

pub use python::{py_float_repr, py_json_dumps, strip as py_strip, JsonOptions};

#[derive(Debug, ThisError)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Compile(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// What one render gets besides the special tokens.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    /// The conversation as the engine passes it (content already a string).
    pub messages: &'a [Json],
    /// Tool definitions (`{"type": "function", "function": {...}}`), if the request has any.
    pub tools: Option<&'a [Json]>,
    pub documents: Option<&'a Json>,
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs` and what the engine adds to them).
    pub kwargs: &'a Map<String, Json>,
}

/// A compiled chat template with the tokenizer's special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    special: Vec<(String, Value)>,
    special_json: Map<String, Json>,
    /// Whether rendering only a conversation's new messages is allowed (see
    /// [`ChatTemplate::incremental`]), once checked.
    incremental: std::sync::OnceLock<bool>,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `special_tokens` are the template variables transformers derives from
    /// the tokenizer (`bos_token`, `eos_token`, `additional_special_tokens`, ...).
    pub fn new(source: &str, special_tokens: &Map<String, Json>) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(python::method);
        env.set_formatter(|out, _state, value| {
            out.write_str(&python::py_str(value)).map_err(|_| Error::from(ErrorKind::WriteFailure))
        });
        env.add_filter("tojson", tojson);
        env.add_filter("trim", |s: String, chars: Option<String>| {
            python::strip(&s, chars.as_deref(), true, true).to_owned()
        });
        env.add_filter("string", |v: Value| python::py_str(&v));
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| python::strftime_now(&fmt));
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| TemplateError::Compile(e.to_string()))?;
        let special = special_tokens.iter().map(|(k, v)| (k.clone(), jinja_value(v))).collect();
        Ok(ChatTemplate {
            env,
            special,
            special_json: special_tokens.clone(),
            incremental: std::sync::OnceLock::new(),
        })
    }

    /// The special-token variables, as given to [`ChatTemplate::new`].
    pub fn special_tokens(&self) -> &Map<String, Json> {
        &self.special_json
    }

    /// Renders one conversation.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, TemplateError> {
        let tmpl = self.env.get_template(NAME).map_err(|e| TemplateError::Render(e.to_string()))?;
        let mut ctx: Vec<(String, Value)> = self.special.clone();
        ctx.extend(input.kwargs.iter().map(|(k, v)| (k.clone(), jinja_value(v))));
        ctx.push(("messages".into(), input.messages.iter().map(jinja_value).collect()));
        ctx.push((
            "tools".into(),
            input.tools.map_or(Value::from(()), |t| t.iter().map(jinja_value).collect()),
        ));
        ctx.push(("documents".into(), input.documents.map_or(Value::from(()), jinja_value)));
        ctx.push(("add_generation_prompt".into(), Value::from(input.add_generation_prompt)));
        // Later entries win, as keyword arguments do in transformers.
        let ctx: Value = ctx.into_iter().collect();
        tmpl.render(ctx).map_err(|e| TemplateError::Render(e.to_string()))
    }
}

/// Python's `str()` of a JSON value (`{'a': [1, None]}`), as vLLM's converters write it.
pub fn py_str_json(v: &Json) -> String {
    python::py_str(&jinja_value(v))
}

/// A JSON value of a request as the template sees it: what Python's `json` made of it (see
/// [`crate::decision::pyjson`]): integers beyond 64 bits stay integers, NaN and the infinities
/// are floats, and each prints as Python prints it.
pub fn jinja_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => items.iter().map(jinja_value).collect(),
        Json::Object(m) => match special_number(v) {
            Some(spelling) => python_number(spelling),
            None => m.iter().map(|(k, v)| (k.as_str(), jinja_value(v))).collect(),
        },
    }
}

/// A number Python spells `spelling` in JSON: `NaN`, `Infinity`, `-Infinity` or an integer.
fn python_number(spelling: &str) -> Value {
    match spelling {
        "NaN" => Value::from(f64::NAN),
        "Infinity" => Value::from(f64::INFINITY),
        "-Infinity" => Value::from(f64::NEG_INFINITY),
        digits => match digits.parse::<i128>() {
            Ok(i) => Value::from(i),
            Err(_) => Value::from_object(BigInt(Arc::from(digits))),
        },
    }
}

/// A Python integer beyond 128 bits (its digits): it prints, and `tojson` writes it, as is.
#[derive(Debug)]
pub(crate) struct BigInt(pub(crate) Arc<str>);

impl Object for BigInt {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// positional or by keyword.
fn tojson(_state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut slots: [Option<Value>; 4] = Default::default();
    for (slot, v) in slots.iter_mut().zip(args.0) {
        *slot = Some(v);
    }
    for (i, name) in ["ensure_ascii", "indent", "separators", "sort_keys"].iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            slots[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let opts = JsonOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent: python::indent_arg(indent.as_ref())?,
        separators: python::separators_arg(separators.as_ref())?,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    Ok(Value::from_safe_string(py_json_dumps(&value, &opts)?))
}

#[cfg(test)]
mod tests;
