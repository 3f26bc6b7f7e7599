//! Owned driver resources: the device's primary context, device allocations and pinned host
//! memory. Each releases itself on drop; the backend drops them before the context.

use std::ffi::c_void;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use flashrt_kernels::DevPtr;

use crate::error::{Error, Result};

/// Maps a driver error to the runtime's error, naming the failed call.
pub fn check<T>(what: &str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|e| Error::Backend(format!("CUDA {what}: {e:?}")))
}

/// Why CUDA cannot run here, or the name of device `ordinal`. Never panics: cudarc panics when a
/// library is missing, so every library is probed before the first call into it.
pub fn probe(ordinal: usize) -> std::result::Result<String, String> {
    // SAFETY: only attempts to dlopen the libraries by their usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver: libcuda.so is not on the library path".into());
    }
    result::init().map_err(|e| format!("the CUDA driver did not initialise: {e:?}"))?;
    let count = result::device::get_count().map_err(|e| format!("cannot count CUDA devices: {e:?}"))?;
    if ordinal >= count.max(0) as usize {
        return Err(format!("CUDA device {ordinal} requested, {count} present"));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        return Err("cuBLASLt (libcublasLt) is not on the library path".into());
    }
    let dev = result::device::get(ordinal as i32).map_err(|e| format!("CUDA device {ordinal}: {e:?}"))?;
    result::device::get_name(dev).map_err(|e| format!("CUDA device {ordinal} name: {e:?}"))
}

/// The device's primary context, retained for the backend's lifetime.
pub struct Context {
    pub device: sys::CUdevice,
    pub ctx: sys::CUcontext,
}

impl Context {
    /// Retains device `ordinal`'s primary context and makes it current. Call [`probe`] first.
    pub fn new(ordinal: usize) -> Result<Context> {
        let device = check("cuDeviceGet", result::device::get(ordinal as i32))?;
        // SAFETY: the driver is initialised (probe) and `device` is valid.
        let ctx = check("cuDevicePrimaryCtxRetain", unsafe { result::primary_ctx::retain(device) })?;
        let context = Context { device, ctx };
        context.make_current()?;
        Ok(context)
    }

    /// Binds the context to the calling thread (cheap; the backend may move between threads).
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained for as long as `self` lives.
        check("cuCtxSetCurrent", unsafe { result::ctx::set_current(self.ctx) })
    }

    fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: `device` is valid; the attribute is a plain integer query.
        check("cuDeviceGetAttribute", unsafe { result::device::get_attribute(self.device, attribute) })
    }

    /// The device's compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        let major = self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major as u32, minor as u32))
    }

    /// Streaming multiprocessors of the device.
    pub fn multiprocessors(&self) -> Result<usize> {
        Ok(self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize)
    }

    /// Bytes of device memory (on a Jetson: the module's DRAM as the OS reports it).
    pub fn total_memory(&self) -> Result<usize> {
        // SAFETY: `device` is valid.
        check("cuDeviceTotalMem", unsafe { result::device::total_mem(self.device) })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`; nothing can be done about a failure at teardown.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// A non-blocking stream (graph capture needs one that is not the legacy default stream).
pub struct Stream(pub sys::CUstream);

impl Stream {
    /// A stream of the given priority (numerically lower runs first; see [`Stream::priorities`]).
    pub fn with_priority(priority: i32) -> Result<Stream> {
        let kind = result::stream::StreamKind::NonBlocking;
        Ok(Stream(check("cuStreamCreateWithPriority", result::stream::create_with_priority(kind, priority))?))
    }

    /// The context's (lowest, highest) stream priorities, e.g. (0, -5).
    pub fn priorities() -> Result<(i32, i32)> {
        check("cuCtxGetStreamPriorityRange", result::stream::get_priority_range())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once after its work has finished.
        unsafe {
            let _ = result::stream::synchronize(self.0);
            let _ = result::stream::destroy(self.0);
        }
    }
}

/// A captured graph, not instantiated: the body of a conditional node.
pub struct CapturedGraph(sys::CUgraph);

impl CapturedGraph {
    /// Captures everything `issue` enqueues on `stream` (relaxed mode: cuBLASLt may query
    /// function attributes while capturing).
    pub fn capture(stream: sys::CUstream, issue: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        // SAFETY: the caller owns the idle stream; the capture is ended on every path.
        unsafe {
            check("cuStreamBeginCapture", result::stream::begin_capture(stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED))?;
            let issued = issue();
            let graph = result::stream::end_capture(stream);
            issued?;
            Ok(CapturedGraph(check("cuStreamEndCapture", graph)?))
        }
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        // SAFETY: created in `capture`, destroyed once.
        let _ = unsafe { result::graph::destroy(self.0) };
    }
}

/// What stream capture on a stream has recorded so far: the graph, and the nodes (with their
/// edge data; arrays owned by the driver, valid until the capture changes) that work enqueued
/// next would depend on.
struct CaptureState {
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    edges: *const sys::CUgraphEdgeData,
    count: usize,
}

fn capture_state(stream: sys::CUstream) -> Result<CaptureState> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut c = CaptureState { graph: std::ptr::null_mut(), deps: std::ptr::null(), edges: std::ptr::null(), count: 0 };
    // SAFETY: every out-pointer is a live local.
    let r = unsafe {
        sys::cuStreamGetCaptureInfo_v3(stream, &mut status, std::ptr::null_mut(), &mut c.graph, &mut c.deps, &mut c.edges, &mut c.count)
    };
    check("cuStreamGetCaptureInfo", r.result())?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Err(Error::Backend("a conditional node needs a stream under capture".into()));
    }
    Ok(c)
}

/// Under capture on `stream`: a handle for an IF node of the graph being captured, 0 at the start
/// of every launch until a kernel sets it (`cudaGraphSetConditional`).
pub fn conditional_handle(stream: sys::CUstream, ctx: sys::CUcontext) -> Result<u64> {
    let graph = capture_state(stream)?.graph;
    let mut handle = 0;
    // SAFETY: `graph` is the live capture graph; `handle` a live local.
    let r = unsafe { sys::cuGraphConditionalHandleCreate(&mut handle, graph, ctx, 0, sys::CU_GRAPH_COND_ASSIGN_DEFAULT) };
    check("cuGraphConditionalHandleCreate", r.result())?;
    Ok(handle)
}

/// Under capture on `stream`: an IF node on `handle` after the stream's work so far, whose body
/// is a copy of `body`; the stream's later work follows it.
pub fn capture_if(stream: sys::CUstream, ctx: sys::CUcontext, handle: u64, body: &CapturedGraph) -> Result<()> {
    let c = capture_state(stream)?;
    // SAFETY (whole block): `c`'s arrays are read by the first call, before the capture changes;
    // the conditional parameters are zero-initialised plain data with the union's `conditional`
    // member set; out-pointers are live locals.
    unsafe {
        let mut params: sys::CUgraphNodeParams = std::mem::zeroed();
        params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
            size: 1,
            phGraph_out: std::ptr::null_mut(),
            ctx,
        };
        let mut node = std::ptr::null_mut();
        check("cuGraphAddNode (conditional)", sys::cuGraphAddNode_v2(&mut node, c.graph, c.deps, c.edges, c.count, &mut params).result())?;
        let r = sys::cuStreamUpdateCaptureDependencies_v2(
            stream,
            &mut node,
            std::ptr::null(),
            1,
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
        );
        check("cuStreamUpdateCaptureDependencies", r.result())?;
        let body_graph = *params.__bindgen_anon_1.conditional.phGraph_out;
        let mut child = std::ptr::null_mut();
        check("cuGraphAddChildGraphNode", sys::cuGraphAddChildGraphNode(&mut child, body_graph, std::ptr::null(), 0, body.0).result())?;
    }
    Ok(())
}

/// An instantiated CUDA graph and the graph it came from.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    /// Captures everything `issue` enqueues on `stream` (relaxed mode: cuBLASLt may query
    /// function attributes while capturing) and instantiates it.
    pub fn capture(stream: sys::CUstream, issue: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let captured = CapturedGraph::capture(stream, issue)?;
        let mut g = Graph { graph: captured.0, exec: std::ptr::null_mut() };
        std::mem::forget(captured);
        // Kernel nodes keep the priority of the stream they were captured from.
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
        // SAFETY: `g.graph` is a complete captured graph; the exec is destroyed with `g`.
        unsafe {
            g.exec = check("cuGraphInstantiate", result::graph::instantiate(g.graph, flags))?;
            check("cuGraphUpload", result::graph::upload(g.exec, stream))?;
        }
        Ok(g)
    }

    /// Enqueues one replay on `stream`.
    pub fn launch(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the exec is valid while `self` lives.
        check("cuGraphLaunch", unsafe { result::graph::launch(self.exec, stream) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles were created in `capture` and are destroyed once.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// An event: a timing mark, or (under capture) an edge from one stream's work to another's.
pub struct Event(sys::CUevent);

impl Event {
    pub fn new() -> Result<Event> {
        Ok(Event(check("cuEventCreate", result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT))?))
    }

    /// An event only for ordering streams (no timestamps: cheaper to record).
    pub fn ordering() -> Result<Event> {
        Ok(Event(check("cuEventCreate", result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?))
    }

    pub fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: event and stream are live.
        check("cuEventRecord", unsafe { result::event::record(self.0, stream) })
    }

    /// Work enqueued on `stream` after this call waits for the work before the last `record`.
    pub fn wait(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: event and stream are live.
        check("cuStreamWaitEvent", unsafe { result::stream::wait_event(stream, self.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) })
    }

    /// Milliseconds from `start` to `self` (both recorded; waits for `self`).
    pub fn since(&self, start: &Event) -> Result<f32> {
        // SAFETY: both events are live and recorded.
        unsafe {
            check("cuEventSynchronize", result::event::synchronize(self.0))?;
            check("cuEventElapsedTime", result::event::elapsed(start.0, self.0))
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// Mean milliseconds of one replay of `graph` over `reps` replays, after one warm replay.
pub fn time_replays(graph: &Graph, stream: sys::CUstream, reps: usize) -> Result<f32> {
    let (start, end) = (Event::new()?, Event::new()?);
    graph.launch(stream)?;
    start.record(stream)?;
    for _ in 0..reps {
        graph.launch(stream)?;
    }
    end.record(stream)?;
    Ok(end.since(&start)? / reps as f32)
}

/// A cuBLASLt handle.
pub struct BlasLt(pub cudarc::cublaslt::sys::cublasLtHandle_t);

impl BlasLt {
    pub fn new() -> Result<BlasLt> {
        Ok(BlasLt(cudarc::cublaslt::result::create_handle().map_err(|e| Error::Backend(format!("cuBLASLt handle: {e:?}")))?))
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { cudarc::cublaslt::result::destroy_handle(self.0) };
    }
}

/// One device allocation.
pub struct DeviceMemory {
    pub ptr: DevPtr,
    pub bytes: usize,
}

impl DeviceMemory {
    pub fn new(bytes: usize, what: &str) -> Result<DeviceMemory> {
        // SAFETY: plain allocation in the current context; contents are initialised by the caller.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| Error::Backend(format!("allocating {bytes} bytes of device memory for {what}: {e:?}")))?;
        Ok(DeviceMemory { ptr, bytes })
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once, with the owning context current (backend drop).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Element types viewed through [`Pinned`] memory: plain data, valid for any bit pattern.
pub trait HostElem: Copy {}
impl HostElem for u8 {}
impl HostElem for u16 {}
impl HostElem for i32 {}
impl HostElem for f32 {}

/// Page-locked host memory, mapped into the device's address space so kernels can read it
/// directly (camera frames) and copies from it can be captured in a graph.
pub struct Pinned {
    pub host: *mut u8,
    pub device: DevPtr,
    pub bytes: usize,
}

impl Pinned {
    pub fn new(bytes: usize, what: &str) -> Result<Pinned> {
        // SAFETY: plain pinned allocation; it is zeroed below before any use.
        let host = unsafe { result::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(|e| Error::Backend(format!("allocating {bytes} bytes of pinned host memory for {what}: {e:?}")))?
            as *mut u8;
        // SAFETY: `host` points to `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        let mut device: DevPtr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in the current context.
        let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) }.result();
        let pinned = Pinned { host, device, bytes };
        check("cuMemHostGetDevicePointer", mapped)?;
        Ok(pinned)
    }

    pub fn as_mut_slice<T: HostElem>(&mut self) -> &mut [T] {
        // SAFETY: the allocation is `bytes` long, page-aligned (so aligned for T) and zeroed, and
        // `HostElem` types are plain data valid for any bit pattern.
        unsafe { std::slice::from_raw_parts_mut(self.host as *mut T, self.bytes / std::mem::size_of::<T>()) }
    }

    pub fn as_slice<T: HostElem>(&self) -> &[T] {
        // SAFETY: as in `as_mut_slice`.
        unsafe { std::slice::from_raw_parts(self.host as *const T, self.bytes / std::mem::size_of::<T>()) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        let _ = unsafe { result::free_host(self.host as *mut c_void) };
    }
}
