//! The body scan of a chat request (`/v1/chat/completions`): `messages` read message by
//! message straight into the conversation vLLM builds ([`Conversation`]), each message's
//! content string moved into it without a copy, the fields no message keeps skipped (see
//! `scan` for what makes the scan give up and the general path take the body).

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::chat::{Content, Conversation, Messages, MESSAGE_FIELDS};
use super::scan::{self, give_up, maybe_python_int, Field, Skip, SkipVisitor};
use super::RequestError;

/// The top level of a chat body with its messages read (`None`: take the general path).
pub(super) fn split_messages(body: &[u8]) -> Option<(Map<String, Value>, Messages)> {
    let top = scan::split::<MessagesField>(body)?;
    let messages = top.field.map_or(Err(RequestError::InvalidMessages), |m| m.0);
    Some((top.obj, messages))
}

/// `messages` as [`super::chat::conversation`] makes it of the same value.
pub(super) struct MessagesField(Messages);

impl Field for MessagesField {
    const KEY: &'static str = "messages";
}

impl<'de> Deserialize<'de> for MessagesField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MessagesVisitor)
    }
}

struct MessagesVisitor;

impl MessagesVisitor {
    /// A value that is not an array of messages, read to its end.
    fn not_a_list<'de, D: Deserializer<'de>>(d: D) -> Result<MessagesField, D::Error> {
        d.deserialize_any(SkipVisitor)?;
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
}

impl<'de> Visitor<'de> for MessagesVisitor {
    type Value = MessagesField;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MessagesField, A::Error> {
        let mut conv = Conversation::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        let mut result = Ok(());
        let mut any = false;
        while let Some(msg) = seq.next_element::<Message>()? {
            any = true;
            if result.is_err() {
                // The error is known; the rest is still read, as JSON.
                continue;
            }
            result = match msg {
                Message::Object { fields, content } => {
                    let get = |key: &str| fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v);
                    match content {
                        Ok(ContentField::Text(t)) => conv.push(get, Content::Text(t)),
                        Ok(ContentField::Parts(p)) => conv.push(get, Content::Parts(&p)),
                        Err(e) => Err(e),
                    }
                }
                Message::NotObject => Err(RequestError::InvalidMessages),
            };
        }
        let messages = match result {
            Ok(()) if any => Ok(conv.finish()),
            Ok(()) => Err(RequestError::InvalidMessages),
            Err(e) => Err(e),
        };
        Ok(MessagesField(messages))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MessagesField, A::Error> {
        Self::not_a_list(serde::de::value::MapAccessDeserializer::new(map))
    }
    fn visit_bool<E>(self, _: bool) -> Result<MessagesField, E> {
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
    fn visit_i64<E>(self, _: i64) -> Result<MessagesField, E> {
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
    fn visit_u64<E>(self, _: u64) -> Result<MessagesField, E> {
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
    fn visit_f64<E>(self, _: f64) -> Result<MessagesField, E> {
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
    fn visit_str<E>(self, _: &str) -> Result<MessagesField, E> {
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
    fn visit_unit<E>(self) -> Result<MessagesField, E> {
        Ok(MessagesField(Err(RequestError::InvalidMessages)))
    }
}

/// One message of the list: the fields a message keeps ([`MESSAGE_FIELDS`], the last of a
/// duplicate key), its content (`Err` when it is of no valid type), the rest skipped.
enum Message {
    Object { fields: Vec<(&'static str, Value)>, content: Result<ContentField, RequestError> },
    NotObject,
}

/// A message's content as read.
enum ContentField {
    Text(String),
    Parts(Vec<Value>),
}

/// A message key: `content`, a field a message keeps, or one it does not.
enum Key {
    Content,
    Kept(&'static str),
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                if v == "content" {
                    return Ok(Key::Content);
                }
                Ok(MESSAGE_FIELDS.iter().find(|k| **k == v).map_or(Key::Other, |k| Key::Kept(k)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MessageVisitor;
        impl<'de> Visitor<'de> for MessageVisitor {
            type Value = Message;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
                let mut fields: Vec<(&'static str, Value)> = Vec::new();
                let mut content = Ok(ContentField::Parts(Vec::new()));
                while let Some(key) = map.next_key::<Key>()? {
                    if let Key::Content = key {
                        content = map.next_value::<ContentValue>()?.0;
                    } else if let Key::Kept(k) = key {
                        let v: Value = map.next_value()?;
                        // A kept value must read as Python reads it (see `scan`).
                        if maybe_python_int(&v) {
                            return Err(give_up());
                        }
                        match fields.iter_mut().find(|(f, _)| *f == k) {
                            Some(slot) => slot.1 = v,
                            None => fields.push((k, v)),
                        }
                    } else {
                        map.next_value::<Skip>()?;
                    }
                }
                Ok(Message::Object { fields, content })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Message, A::Error> {
                while seq.next_element::<Skip>()?.is_some() {}
                Ok(Message::NotObject)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Message, E> {
                Ok(Message::NotObject)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Message, E> {
                Ok(Message::NotObject)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Message, E> {
                Ok(Message::NotObject)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Message, E> {
                Ok(Message::NotObject)
            }
            fn visit_str<E>(self, _: &str) -> Result<Message, E> {
                Ok(Message::NotObject)
            }
            fn visit_unit<E>(self) -> Result<Message, E> {
                Ok(Message::NotObject)
            }
        }
        d.deserialize_any(MessageVisitor)
    }
}

/// A content value: a string, null (no parts), an array of parts (kept as JSON values: they
/// are few, and their text is copied once into the message's), anything else an error.
struct ContentValue(Result<ContentField, RequestError>);

impl<'de> Deserialize<'de> for ContentValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        fn bad<E>() -> Result<ContentValue, E> {
            Ok(ContentValue(Err(RequestError::InvalidMessages)))
        }
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = ContentValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message content")
            }
            fn visit_str<E>(self, v: &str) -> Result<ContentValue, E> {
                Ok(ContentValue(Ok(ContentField::Text(v.to_owned()))))
            }
            fn visit_string<E>(self, v: String) -> Result<ContentValue, E> {
                Ok(ContentValue(Ok(ContentField::Text(v))))
            }
            fn visit_unit<E>(self) -> Result<ContentValue, E> {
                Ok(ContentValue(Ok(ContentField::Parts(Vec::new()))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ContentValue, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(p) = seq.next_element::<Value>()? {
                    parts.push(p);
                }
                Ok(ContentValue(Ok(ContentField::Parts(parts))))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ContentValue, A::Error> {
                while map.next_entry::<Skip, Skip>()?.is_some() {}
                bad()
            }
            fn visit_bool<E>(self, _: bool) -> Result<ContentValue, E> {
                bad()
            }
            fn visit_i64<E>(self, _: i64) -> Result<ContentValue, E> {
                bad()
            }
            fn visit_u64<E>(self, _: u64) -> Result<ContentValue, E> {
                bad()
            }
            fn visit_f64<E>(self, _: f64) -> Result<ContentValue, E> {
                bad()
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}
