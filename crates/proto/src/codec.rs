//! The codec of the generated client and server: prost's, except that a message is
//! encoded into room reserved for its whole length. tonic's buffer starts at 8 KiB
//! and grows by copying as a message is written, so a page of 500 objects (about
//! 300 KB) was copied about six times over into fresh allocations before it was
//! sent; now it is written once.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec as TonicCodec, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder};

/// prost's encoding, each message written into room reserved for it.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> TonicCodec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = Reserving<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        Reserving(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
}

/// Encodes a message into room reserved for its whole length.
#[derive(Debug, Clone)]
pub struct Reserving<T>(PhantomData<T>);

impl<T: Message> Encoder for Reserving<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode_raw(buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tonic::codec::EncodeBody;

    /// The bytes tonic sends for `page` with `encoder`.
    async fn sent(
        encoder: impl Encoder<Item = crate::ListResponse, Error = Status>,
        page: crate::ListResponse,
    ) -> Vec<u8> {
        let source = futures::stream::iter([Ok(page)]);
        let body = EncodeBody::new_client(encoder, source, None, None);
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn a_message_is_sent_as_prost_s_own_codec_sends_it() {
        let page = crate::ListResponse {
            items: (0..500)
                .map(|i| crate::Object {
                    cluster: "a".into(),
                    resource: "pods".into(),
                    namespace: "default".into(),
                    name: format!("pod-{i}"),
                    json: fleetscope_model::Json::from(format!(
                        "{{\"x\":\"{}\"}}",
                        "1".repeat(600)
                    )),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let ours = sent(Reserving(PhantomData), page.clone()).await;
        let prost = sent(
            ProstCodec::<crate::ListResponse, crate::ListResponse>::default().encoder(),
            page.clone(),
        )
        .await;
        assert_eq!(ours, prost);
        assert_eq!(ours.len(), 5 + page.encoded_len());
    }
}
