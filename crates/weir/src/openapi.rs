//! JSON schemas for the config types whose wire form is another type's (`serde(try_from,
//! into)`): the schema a client sees is the wire form's, under the public type's name.

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
