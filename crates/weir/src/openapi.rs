//! JSON schemas the derives cannot make: a duration as policies write it, and the config types
//! whose wire form is another type's (`serde(try_from, into)`), whose schema a client sees is
//! the wire form's under the public type's name.

use std::borrow::Cow;

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};

/// A duration as a policy writes it (`crate::duration`): whole numbers with units, such as
/// `5s`, `100ms` or `1h 30m`. Its schema is the `Duration` component every duration field
/// refers to.
pub(crate) struct Duration;

impl utoipa::PartialSchema for Duration {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .description(Some(
                "A duration: whole numbers with units (ns, us, ms, s, m or min, h, d, w), \
                 such as `5s`, `100ms` or `1h 30m`.",
            ))
            .pattern(Some(
                "^[0-9]+(ns|us|ms|s|m|min|h|d|w)( ?[0-9]+(ns|us|ms|s|m|min|h|d|w))*$",
            ))
            .examples(["5s", "100ms", "1h 30m"])
            .into()
    }
}

impl utoipa::ToSchema for Duration {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Duration")
    }
}

/// Implements utoipa's `ToSchema` for `$public` as the derived schema of `$wire`, the type
/// serde reads and writes it through.
macro_rules! schema_as {
    ($public:ty, $wire:ty) => {
        impl utoipa::PartialSchema for $public {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                <$wire as utoipa::PartialSchema>::schema()
            }
        }

        impl utoipa::ToSchema for $public {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($public))
            }

            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                <$wire as utoipa::ToSchema>::schemas(schemas)
            }
        }
    };
}

pub(crate) use schema_as;
