//! GGUF metadata values and the key-value table, with typed accessors whose errors
//! name the key.

use std::collections::HashMap;

use super::error::PackErrorKind;

/// GGUF value type ids (gguf.md, `enum gguf_metadata_value_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`, if any.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType as T;
        Some(match id {
            0 => T::U8,
            1 => T::I8,
            2 => T::U16,
            3 => T::I16,
            4 => T::U32,
            5 => T::I32,
            6 => T::F32,
            7 => T::Bool,
            8 => T::String,
            9 => T::Array,
            10 => T::U64,
            11 => T::I64,
            12 => T::F64,
            _ => return None,
        })
    }

    /// Bytes one value of this type takes at least: exact for scalars; a string takes
    /// its 8-byte length, an array its 4-byte type and 8-byte count. Used to refuse
    /// counts that cannot fit in what is left of the file before allocating.
    pub fn min_bytes(self) -> u64 {
        use ValueType as T;
        match self {
            T::U8 | T::I8 | T::Bool => 1,
            T::U16 | T::I16 => 2,
            T::U32 | T::I32 | T::F32 => 4,
            T::U64 | T::I64 | T::F64 | T::String => 8,
            T::Array => 12,
        }
    }

    /// Lower-case name, as `inspect` shows it.
    pub fn name(self) -> &'static str {
        use ValueType as T;
        match self {
            T::U8 => "u8",
            T::I8 => "i8",
            T::U16 => "u16",
            T::I16 => "i16",
            T::U32 => "u32",
            T::I32 => "i32",
            T::F32 => "f32",
            T::Bool => "bool",
            T::String => "string",
            T::Array => "array",
            T::U64 => "u64",
            T::I64 => "i64",
            T::F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A homogeneous array; arrays of arrays hold each inner array with its own type.
/// Kept typed (not a `Vec<Value>`) so tokenizer tables of 100k+ entries stay compact.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    /// The GGUF type of this value.
    pub fn value_type(&self) -> ValueType {
        use ValueType as T;
        match self {
            Value::U8(_) => T::U8,
            Value::I8(_) => T::I8,
            Value::U16(_) => T::U16,
            Value::I16(_) => T::I16,
            Value::U32(_) => T::U32,
            Value::I32(_) => T::I32,
            Value::U64(_) => T::U64,
            Value::I64(_) => T::I64,
            Value::F32(_) => T::F32,
            Value::F64(_) => T::F64,
            Value::Bool(_) => T::Bool,
            Value::String(_) => T::String,
            Value::Array(_) => T::Array,
        }
    }

    /// The value as an unsigned integer, whatever integer type stored it.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, from any float or integer type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// A short human rendering: scalars in full, arrays summarized past `max_items`.
    pub fn display(&self, max_items: usize) -> String {
        match self {
            Value::String(s) => format!("{s:?}"),
            Value::Array(a) => a.display(max_items),
            Value::Bool(b) => b.to_string(),
            Value::F32(v) => v.to_string(),
            Value::F64(v) => v.to_string(),
            other => other
                .as_u64()
                .map_or_else(|| other.as_f64().map_or_else(String::new, |v| v.to_string()), |v| v.to_string()),
        }
    }
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF type of the elements.
    pub fn element_type(&self) -> ValueType {
        use ValueType as T;
        match self {
            Array::U8(_) => T::U8,
            Array::I8(_) => T::I8,
            Array::U16(_) => T::U16,
            Array::I16(_) => T::I16,
            Array::U32(_) => T::U32,
            Array::I32(_) => T::I32,
            Array::U64(_) => T::U64,
            Array::I64(_) => T::I64,
            Array::F32(_) => T::F32,
            Array::F64(_) => T::F64,
            Array::Bool(_) => T::Bool,
            Array::String(_) => T::String,
            Array::Array(_) => T::Array,
        }
    }

    /// Element `i` as a value.
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
        })
    }

    /// `[a, b, c]` in full up to `max_items` elements, else `[N × type]`.
    pub fn display(&self, max_items: usize) -> String {
        let n = self.len();
        if n > max_items {
            return format!("[{n} × {}]", self.element_type().name());
        }
        let items: Vec<String> = (0..n).filter_map(|i| self.get(i)).map(|v| v.display(max_items)).collect();
        format!("[{}]", items.join(", "))
    }
}

/// The metadata table of a pack, in file order, indexed by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds `key`, or gives back the value when the key is already present.
    pub fn insert(&mut self, key: String, value: Value) -> Result<(), Value> {
        if self.index.contains_key(&key) {
            return Err(value);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// An unsigned integer under `key` (any integer type), `None` when absent.
    pub fn u64(&self, key: &str) -> Result<Option<u64>, PackErrorKind> {
        self.typed(key, "an unsigned integer", Value::as_u64)
    }

    /// Like [`Metadata::u64`], for values that must fit in a u32.
    pub fn u32(&self, key: &str) -> Result<Option<u32>, PackErrorKind> {
        self.typed(key, "an unsigned integer below 2^32", |v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
    }

    /// A number under `key` (any float or integer type), `None` when absent.
    pub fn f64(&self, key: &str) -> Result<Option<f64>, PackErrorKind> {
        self.typed(key, "a number", Value::as_f64)
    }

    /// A string under `key`, `None` when absent.
    pub fn str(&self, key: &str) -> Result<Option<&str>, PackErrorKind> {
        self.typed(key, "a string", |v| match v {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// A bool under `key`, `None` when absent.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, PackErrorKind> {
        self.typed(key, "a bool", |v| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        })
    }

    /// An array under `key`, `None` when absent.
    pub fn array(&self, key: &str) -> Result<Option<&Array>, PackErrorKind> {
        self.typed(key, "an array", |v| match v {
            Value::Array(a) => Some(a),
            _ => None,
        })
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        convert: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, PackErrorKind> {
        let Some(value) = self.get(key) else { return Ok(None) };
        convert(value).map(Some).ok_or_else(|| PackErrorKind::Key {
            key: key.to_owned(),
            what: format!("expected {expected}, found {} {}", value.value_type().name(), value.display(4)),
        })
    }
}
