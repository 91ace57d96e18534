//! Status codes (SCT and SC) of NVMe completions, with their names: the generic ones, the
//! NVM command set's, the command specific ones of the admin and Fabrics commands, and the
//! media and data integrity errors.

/// A status code and its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StatusCode {
    /// Status code type (0 generic, 1 command specific, 2 media and data integrity, 3 path
    /// related).
    pub sct: u8,
    /// Status code.
    pub sc: u8,
}

macro_rules! codes {
    ($($(#[$doc:meta])* $name:ident = ($sct:expr, $sc:expr, $text:expr);)*) => {
        impl StatusCode {
            $($(#[$doc])* pub const $name: StatusCode = StatusCode { sct: $sct, sc: $sc };)*

            /// The specification's name of this status, if it is one listed here.
            pub fn name(&self) -> Option<&'static str> {
                match (self.sct, self.sc) {
                    $(($sct, $sc) => Some($text),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// Successful Completion.
    SUCCESS = (0, 0x00, "Successful Completion");
    /// Invalid Command Opcode.
    INVALID_OPCODE = (0, 0x01, "Invalid Command Opcode");
    /// Invalid Field in Command.
    INVALID_FIELD = (0, 0x02, "Invalid Field in Command");
    /// Command ID Conflict.
    CID_CONFLICT = (0, 0x03, "Command ID Conflict");
    /// Data Transfer Error.
    DATA_TRANSFER_ERROR = (0, 0x04, "Data Transfer Error");
    /// Internal Error.
    INTERNAL_ERROR = (0, 0x06, "Internal Error");
    /// Command Abort Requested.
    ABORT_REQUESTED = (0, 0x07, "Command Abort Requested");
    /// Command Aborted due to Failed Fused Command.
    ABORTED_FAILED_FUSED = (0, 0x09, "Command Aborted due to Failed Fused Command");
    /// Command Aborted due to Missing Fused Command.
    ABORTED_MISSING_FUSED = (0, 0x0A, "Command Aborted due to Missing Fused Command");
    /// Invalid Namespace or Format.
    INVALID_NAMESPACE = (0, 0x0B, "Invalid Namespace or Format");
    /// Command Sequence Error.
    COMMAND_SEQUENCE_ERROR = (0, 0x0C, "Command Sequence Error");
    /// Data SGL Length Invalid.
    SGL_LENGTH_INVALID = (0, 0x0F, "Data SGL Length Invalid");
    /// SGL Descriptor Type Invalid.
    SGL_TYPE_INVALID = (0, 0x11, "SGL Descriptor Type Invalid");
    /// SGL Offset Invalid.
    SGL_OFFSET_INVALID = (0, 0x16, "SGL Offset Invalid");
    /// Keep Alive Timer Expired.
    KEEP_ALIVE_EXPIRED = (0, 0x19, "Keep Alive Timer Expired");
    /// Keep Alive Timeout Invalid.
    KEEP_ALIVE_INVALID = (0, 0x1A, "Keep Alive Timeout Invalid");
    /// Namespace is Write Protected.
    NAMESPACE_WRITE_PROTECTED = (0, 0x20, "Namespace is Write Protected");
    /// Transient Transport Error (e.g. a data digest error).
    TRANSIENT_TRANSPORT_ERROR = (0, 0x22, "Transient Transport Error");
    /// LBA Out of Range.
    LBA_OUT_OF_RANGE = (0, 0x80, "LBA Out of Range");
    /// Capacity Exceeded.
    CAPACITY_EXCEEDED = (0, 0x81, "Capacity Exceeded");
    /// Namespace Not Ready.
    NAMESPACE_NOT_READY = (0, 0x82, "Namespace Not Ready");
    /// Reservation Conflict.
    RESERVATION_CONFLICT = (0, 0x83, "Reservation Conflict");
    /// Invalid Queue Identifier.
    INVALID_QUEUE_ID = (1, 0x01, "Invalid Queue Identifier");
    /// Invalid Queue Size.
    INVALID_QUEUE_SIZE = (1, 0x02, "Invalid Queue Size");
    /// Asynchronous Event Request Limit Exceeded.
    AER_LIMIT_EXCEEDED = (1, 0x05, "Asynchronous Event Request Limit Exceeded");
    /// Invalid Log Page.
    INVALID_LOG_PAGE = (1, 0x09, "Invalid Log Page");
    /// Feature Identifier Not Saveable.
    FEATURE_NOT_SAVEABLE = (1, 0x0D, "Feature Identifier Not Saveable");
    /// Feature Not Changeable.
    FEATURE_NOT_CHANGEABLE = (1, 0x0E, "Feature Not Changeable");
    /// Connect: Incompatible Format.
    CONNECT_INCOMPATIBLE_FORMAT = (1, 0x80, "Connect Incompatible Format");
    /// Connect: Controller Busy.
    CONNECT_CONTROLLER_BUSY = (1, 0x81, "Connect Controller Busy");
    /// Connect: Invalid Parameters.
    CONNECT_INVALID_PARAMETERS = (1, 0x82, "Connect Invalid Parameters");
    /// Connect: Restart Discovery.
    CONNECT_RESTART_DISCOVERY = (1, 0x83, "Connect Restart Discovery");
    /// Connect: Invalid Host.
    CONNECT_INVALID_HOST = (1, 0x84, "Connect Invalid Host");
    /// Write Fault.
    WRITE_FAULT = (2, 0x80, "Write Fault");
    /// Unrecovered Read Error.
    UNRECOVERED_READ_ERROR = (2, 0x81, "Unrecovered Read Error");
    /// Compare Failure (the Compare of a Compare-and-Write found other data).
    COMPARE_FAILURE = (2, 0x85, "Compare Failure");
    /// Access Denied.
    ACCESS_DENIED = (2, 0x86, "Access Denied");
}

impl std::fmt::Display for StatusCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (SCT {:#x}, SC {:#04x})", self.sct, self.sc),
            None => write!(f, "SCT {:#x}, SC {:#04x}", self.sct, self.sc),
        }
    }
}
