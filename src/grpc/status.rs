//! The one mapping from the fleet's errors to gRPC status codes.

use fleetscope_model::FleetError;
use tonic::Status;

/// The status a fleet error is answered with.
pub(crate) fn status(e: FleetError) -> Status {
    match e {
        FleetError::Unavailable(m) => Status::unavailable(m),
        FleetError::InvalidArgument(m) => Status::invalid_argument(m),
        FleetError::NotFound(m) => Status::not_found(m),
        FleetError::OutOfRange(m) => Status::out_of_range(m),
        FleetError::ResourceExhausted(m) => Status::resource_exhausted(m),
    }
}
