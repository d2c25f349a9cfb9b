//! The gRPC API's message codec: prost, with a malformed request answered `INVALID_ARGUMENT`.
//!
//! tonic's prost codec answers bytes that do not parse as the request message with `INTERNAL`,
//! the code gRPC's own libraries use. For Weir's API that misleads: the fault is the caller's,
//! asking again cannot help, and clients that retry `INTERNAL` as a server fault would hammer
//! the node with the same bytes. So a request that does not decode is `INVALID_ARGUMENT`, with
//! prost's reason (which field, which wire type) as the message.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with decode failures as `INVALID_ARGUMENT`; generated services use it.
#[derive(Debug, Clone, Default)]
pub struct WeirCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for WeirCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`], with its `INTERNAL` parse failures turned into `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => Status::invalid_argument(format!(
                "the message does not decode as its protobuf type: {}",
                status.message()
            )),
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
