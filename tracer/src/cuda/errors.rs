//! Names of CUDA result codes: `cudaError_t` (runtime) and `CUresult` (driver) number the same
//! failures differently, so the layer picks the table.

use super::table::Layer;

const RUNTIME: &[(i32, &str)] = &[
    (0, "cudaSuccess"),
    (1, "cudaErrorInvalidValue"),
    (2, "cudaErrorMemoryAllocation"),
    (3, "cudaErrorInitializationError"),
    (4, "cudaErrorCudartUnloading"),
    (5, "cudaErrorProfilerDisabled"),
    (9, "cudaErrorInvalidConfiguration"),
    (12, "cudaErrorInvalidPitchValue"),
    (13, "cudaErrorInvalidSymbol"),
    (16, "cudaErrorInvalidHostPointer"),
    (17, "cudaErrorInvalidDevicePointer"),
    (18, "cudaErrorInvalidTexture"),
    (21, "cudaErrorInvalidMemcpyDirection"),
    (34, "cudaErrorStubLibrary"),
    (35, "cudaErrorInsufficientDriver"),
    (36, "cudaErrorCallRequiresNewerDriver"),
    (37, "cudaErrorInvalidSurface"),
    (43, "cudaErrorDuplicateVariableName"),
    (46, "cudaErrorDevicesUnavailable"),
    (49, "cudaErrorIncompatibleDriverContext"),
    (52, "cudaErrorMissingConfiguration"),
    (65, "cudaErrorLaunchMaxDepthExceeded"),
    (98, "cudaErrorInvalidDeviceFunction"),
    (100, "cudaErrorNoDevice"),
    (101, "cudaErrorInvalidDevice"),
    (102, "cudaErrorDeviceNotLicensed"),
    (127, "cudaErrorStartupFailure"),
    (200, "cudaErrorInvalidKernelImage"),
    (201, "cudaErrorDeviceUninitialized"),
    (209, "cudaErrorNoKernelImageForDevice"),
    (214, "cudaErrorECCUncorrectable"),
    (218, "cudaErrorInvalidPtx"),
    (222, "cudaErrorUnsupportedPtxVersion"),
    (300, "cudaErrorInvalidSource"),
    (301, "cudaErrorFileNotFound"),
    (302, "cudaErrorSharedObjectSymbolNotFound"),
    (303, "cudaErrorSharedObjectInitFailed"),
    (304, "cudaErrorOperatingSystem"),
    (400, "cudaErrorInvalidResourceHandle"),
    (401, "cudaErrorIllegalState"),
    (500, "cudaErrorSymbolNotFound"),
    (600, "cudaErrorNotReady"),
    (700, "cudaErrorIllegalAddress"),
    (701, "cudaErrorLaunchOutOfResources"),
    (702, "cudaErrorLaunchTimeout"),
    (709, "cudaErrorContextIsDestroyed"),
    (710, "cudaErrorAssert"),
    (715, "cudaErrorIllegalInstruction"),
    (716, "cudaErrorMisalignedAddress"),
    (719, "cudaErrorLaunchFailure"),
    (720, "cudaErrorCooperativeLaunchTooLarge"),
    (800, "cudaErrorNotPermitted"),
    (801, "cudaErrorNotSupported"),
    (900, "cudaErrorStreamCaptureUnsupported"),
    (901, "cudaErrorStreamCaptureInvalidated"),
    (999, "cudaErrorUnknown"),
];

const DRIVER: &[(i32, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// The code's name, or `cudaError <n>` / `CUresult <n>` for one not in the table.
pub fn name(layer: Layer, code: i32) -> String {
    let (table, prefix) = match layer {
        Layer::Runtime => (RUNTIME, "cudaError"),
        Layer::Driver => (DRIVER, "CUresult"),
    };
    table
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| (*n).to_string())
        .unwrap_or_else(|| format!("{prefix} {code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(Layer::Runtime, 35), "cudaErrorInsufficientDriver");
        assert_eq!(name(Layer::Driver, 100), "CUDA_ERROR_NO_DEVICE");
        assert_eq!(name(Layer::Runtime, 12345), "cudaError 12345");
        for t in [RUNTIME, DRIVER] {
            assert!(
                t.windows(2).all(|w| w[0].0 < w[1].0),
                "tables sorted, no duplicates"
            );
        }
    }
}
