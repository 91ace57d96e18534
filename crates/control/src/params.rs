//! A request's named parameters, read one field at a time by the method that needs them.
//!
//! Every mistake is an -32602 error naming the field and the expected type ("params.lun:
//! expected an unsigned integer, got a string"); [`Params::finish`] refuses fields the method
//! did not read, so a misspelt optional field is an error rather than silently ignored.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::codec::RpcError;

/// The `params` object of one request.
#[derive(Debug, Default)]
pub struct Params {
    fields: Map<String, Value>,
    /// Names read so far, for [`Params::finish`].
    read: Vec<&'static str>,
}

/// The JSON type of `v`, as error messages name it.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_u64() => "an unsigned integer",
        Value::Number(n) if n.is_i64() => "a negative integer",
        Value::Number(_) => "a fractional number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Params {
    pub fn new(fields: Map<String, Value>) -> Params {
        Params {
            fields,
            read: Vec::new(),
        }
    }

    fn take(&mut self, name: &'static str) -> Option<Value> {
        self.read.push(name);
        self.fields.remove(name).filter(|v| !v.is_null())
    }

    fn wrong(name: &str, expected: &str, got: &Value) -> RpcError {
        RpcError::invalid_params(format!(
            "params.{name}: expected {expected}, got {}",
            type_name(got)
        ))
    }

    fn missing(name: &str, expected: &str) -> RpcError {
        RpcError::invalid_params(format!("params.{name} is required ({expected})"))
    }

    /// An optional string.
    pub fn opt_str(&mut self, name: &'static str) -> Result<Option<String>, RpcError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Params::wrong(name, "a string", &v)),
        }
    }

    /// A required string.
    pub fn str(&mut self, name: &'static str) -> Result<String, RpcError> {
        self.opt_str(name)?
            .ok_or_else(|| Params::missing(name, "a string"))
    }

    /// An optional unsigned integer.
    pub fn opt_u64(&mut self, name: &'static str) -> Result<Option<u64>, RpcError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| Params::wrong(name, "an unsigned integer", &v)),
        }
    }

    /// A required unsigned integer.
    pub fn u64(&mut self, name: &'static str) -> Result<u64, RpcError> {
        self.opt_u64(name)?
            .ok_or_else(|| Params::missing(name, "an unsigned integer"))
    }

    /// An optional boolean.
    pub fn opt_bool(&mut self, name: &'static str) -> Result<Option<bool>, RpcError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(Params::wrong(name, "a boolean", &v)),
        }
    }

    /// A required boolean.
    pub fn bool(&mut self, name: &'static str) -> Result<bool, RpcError> {
        self.opt_bool(name)?
            .ok_or_else(|| Params::missing(name, "a boolean"))
    }

    /// A required field of any deserialisable type; `what` describes it for the error
    /// ("a LUN table as in the TOML [target.lun.N]"), and serde's own message follows.
    pub fn typed<T: DeserializeOwned>(
        &mut self,
        name: &'static str,
        what: &str,
    ) -> Result<T, RpcError> {
        let v = self.take(name).ok_or_else(|| Params::missing(name, what))?;
        serde_json::from_value(v)
            .map_err(|e| RpcError::invalid_params(format!("params.{name}: expected {what}: {e}")))
    }

    /// An optional field of any deserialisable type (absent or null: `None`).
    pub fn opt_typed<T: DeserializeOwned>(
        &mut self,
        name: &'static str,
        what: &str,
    ) -> Result<Option<T>, RpcError> {
        match self.take(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
                RpcError::invalid_params(format!("params.{name}: expected {what}: {e}"))
            }),
        }
    }

    /// Every field not read yet, as one `T` (a flat table such as a LUN's, whose own
    /// `deny_unknown_fields` then names a misspelt key); `what` describes it for the error.
    pub fn rest<T: DeserializeOwned>(&mut self, what: &str) -> Result<T, RpcError> {
        let fields = std::mem::take(&mut self.fields);
        serde_json::from_value(Value::Object(fields))
            .map_err(|e| RpcError::invalid_params(format!("params: expected {what}: {e}")))
    }

    /// Refuses fields no accessor asked for, naming them and the ones the method knows.
    pub fn finish(self) -> Result<(), RpcError> {
        match self.fields.keys().next() {
            None => Ok(()),
            Some(k) => Err(RpcError::invalid_params(if self.read.is_empty() {
                format!("params.{k}: unknown; this method takes no parameters")
            } else {
                format!(
                    "params.{k}: unknown; this method takes {}",
                    self.read.join(", ")
                )
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::INVALID_PARAMS;
    use serde_json::json;

    fn params(v: Value) -> Params {
        match v {
            Value::Object(m) => Params::new(m),
            _ => unreachable!(),
        }
    }

    #[test]
    fn fields_read_with_their_types() {
        let mut p = params(json!({"target": "t", "lun": 3, "ro": true, "x": null}));
        assert_eq!(p.str("target").unwrap(), "t");
        assert_eq!(p.u64("lun").unwrap(), 3);
        assert!(p.bool("ro").unwrap());
        assert_eq!(p.opt_str("x").unwrap(), None, "null is absent");
        assert_eq!(p.opt_u64("size").unwrap(), None);
        p.finish().expect("every field read");
    }

    #[test]
    fn a_wrong_type_names_the_field_and_the_expected_type() {
        let e = params(json!({"lun": "1"})).u64("lun").unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert_eq!(
            e.message,
            "params.lun: expected an unsigned integer, got a string"
        );
        let e = params(json!({"lun": -1})).u64("lun").unwrap_err();
        assert!(e.message.contains("negative"), "{e}");
        let e = params(json!({})).str("target").unwrap_err();
        assert_eq!(e.message, "params.target is required (a string)");
        let e = params(json!({"b": 1})).bool("b").unwrap_err();
        assert!(e.message.contains("expected a boolean"), "{e}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut p = params(json!({"target": "t", "tagret": "u"}));
        p.str("target").unwrap();
        let e = p.finish().unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert!(
            e.message.contains("tagret") && e.message.contains("target"),
            "{e}"
        );
        let e = params(json!({"a": 1})).finish().unwrap_err();
        assert!(e.message.contains("no parameters"), "{e}");
    }

    #[test]
    fn the_rest_reads_as_one_table() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Lun {
            size: u64,
        }
        let mut p = params(json!({"target": "t", "size": 4}));
        p.str("target").unwrap();
        assert_eq!(p.rest::<Lun>("a LUN table").unwrap(), Lun { size: 4 });
        p.finish().expect("all read");
        let mut p = params(json!({"size": 4, "sise": 5}));
        let e = p.rest::<Lun>("a LUN table").unwrap_err();
        assert!(e.message.contains("sise"), "{e}");
    }

    #[test]
    fn typed_fields_carry_serde_s_reason() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Lun {
            size: u64,
        }
        let e = params(json!({"lun": {"size": "x"}}))
            .typed::<Lun>("lun", "a LUN table")
            .unwrap_err();
        assert!(
            e.message.starts_with("params.lun: expected a LUN table: "),
            "{e}"
        );
    }
}
