use std::collections::HashMap;

/// Value types of GGUF metadata, numbered as in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaType {
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

impl MetaType {
    pub fn from_u32(v: u32) -> Option<Self> {
        use MetaType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes one value of this type takes at least in the file (used to bound counts).
    pub fn min_size(self) -> usize {
        use MetaType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(..) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// Any integer type as i64 (u64 values above i64::MAX give `None`).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            MetaValue::U8(v) => v as i64,
            MetaValue::I8(v) => v as i64,
            MetaValue::U16(v) => v as i64,
            MetaValue::I16(v) => v as i64,
            MetaValue::U32(v) => v as i64,
            MetaValue::I32(v) => v as i64,
            MetaValue::U64(v) => i64::try_from(v).ok()?,
            MetaValue::I64(v) => v,
            _ => return None,
        })
    }

    /// Any number as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// A short human-readable rendering (long arrays are summarised).
    pub fn display_short(&self, max_chars: usize) -> String {
        let s = match self {
            MetaValue::String(s) => format!("{s:?}"),
            MetaValue::Array(t, items) => {
                let shown: Vec<String> =
                    items.iter().take(8).map(|v| v.display_short(40)).collect();
                let more = if items.len() > 8 { ", …" } else { "" };
                format!("[{:?}; {}] [{}{}]", t, items.len(), shown.join(", "), more)
            }
            MetaValue::U8(v) => v.to_string(),
            MetaValue::I8(v) => v.to_string(),
            MetaValue::U16(v) => v.to_string(),
            MetaValue::I16(v) => v.to_string(),
            MetaValue::U32(v) => v.to_string(),
            MetaValue::I32(v) => v.to_string(),
            MetaValue::U64(v) => v.to_string(),
            MetaValue::I64(v) => v.to_string(),
            MetaValue::F32(v) => v.to_string(),
            MetaValue::F64(v) => v.to_string(),
            MetaValue::Bool(v) => v.to_string(),
        };
        if s.chars().count() > max_chars {
            let cut: String = s.chars().take(max_chars).collect();
            format!("{cut}…")
        } else {
            s
        }
    }
}

/// Metadata key/value pairs in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds a pair; returns false (and keeps the first) when the key is already present.
    pub fn insert(&mut self, key: String, value: MetaValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_i64().and_then(|v| u64::try_from(v).ok())
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f64().map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&[MetaValue]> {
        self.get(key)?.as_array()
    }

    /// A string array (e.g. the vocabulary); `None` if absent or not all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get_array(key)?.iter().map(|v| v.as_str()).collect()
    }

    /// A numeric array as f32 values; `None` if absent or not numeric.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get_array(key)?
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect()
    }

    /// An integer array as i64 values; `None` if absent or not integers.
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.get_array(key)?.iter().map(|v| v.as_i64()).collect()
    }
}
