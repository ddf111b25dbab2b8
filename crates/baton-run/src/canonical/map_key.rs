//! Map keys as the canonical serializer takes them.

use std::borrow::Cow;

use serde::ser::{self, Impossible, Serialize};

use super::{Error, unsupported};

/// Map keys: strings, and the scalars serde_json turns into strings the
/// same way in every version; anything else is left to the general way.
pub(super) struct MapKey;

impl ser::Serializer for MapKey {
    type Ok = Cow<'static, str>;
    type Error = Error;
    type SerializeSeq = Impossible<Cow<'static, str>, Error>;
    type SerializeTuple = Impossible<Cow<'static, str>, Error>;
    type SerializeTupleStruct = Impossible<Cow<'static, str>, Error>;
    type SerializeTupleVariant = Impossible<Cow<'static, str>, Error>;
    type SerializeMap = Impossible<Cow<'static, str>, Error>;
    type SerializeStruct = Impossible<Cow<'static, str>, Error>;
    type SerializeStructVariant = Impossible<Cow<'static, str>, Error>;

    fn serialize_str(self, v: &str) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn serialize_char(self, v: char) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Self::Ok, Error> {
        Ok(Cow::Borrowed(variant))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Self::Ok, Error> {
        value.serialize(self)
    }

    fn serialize_i8(self, v: i8) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_i16(self, v: i16) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_i32(self, v: i32) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_i64(self, v: i64) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_u8(self, v: u8) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_u16(self, v: u16) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_u32(self, v: u32) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_u64(self, v: u64) -> Result<Self::Ok, Error> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn serialize_bool(self, _v: bool) -> Result<Self::Ok, Error> {
        Err(unsupported("a boolean map key"))
    }

    fn serialize_f32(self, _v: f32) -> Result<Self::Ok, Error> {
        Err(unsupported("a float map key"))
    }

    fn serialize_f64(self, _v: f64) -> Result<Self::Ok, Error> {
        Err(unsupported("a float map key"))
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result<Self::Ok, Error> {
        Err(unsupported("a byte-string map key"))
    }

    fn serialize_none(self) -> Result<Self::Ok, Error> {
        Err(unsupported("an absent map key"))
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<Self::Ok, Error> {
        Err(unsupported("an optional map key"))
    }

    fn serialize_unit(self) -> Result<Self::Ok, Error> {
        Err(unsupported("a unit map key"))
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<Self::Ok, Error> {
        Err(unsupported("a unit map key"))
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Self::Ok, Error> {
        Err(unsupported("a variant map key"))
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(unsupported("a sequence map key"))
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(unsupported("a tuple map key"))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(unsupported("a tuple map key"))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(unsupported("a variant map key"))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(unsupported("a map map key"))
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        Err(unsupported("a struct map key"))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(unsupported("a variant map key"))
    }
}
