//! Jetson board profiles: what the runtime should assume about a board, picked from the GPU's
//! compute capability (8.7 = AGX Orin, 11.0 = AGX Thor).
//!
//! The profiles live in `jetson/boards/*.toml`, shared with `jetson/build.sh` (which reads the
//! cargo feature that selects cudarc's CUDA flavour), and are compiled in so a deployed binary
//! needs no data files. The CUDA backend asks [`BoardProfile::for_compute_capability`] at open for
//! the kernel architecture, whether fp8 tensor cores exist and how much unified memory the policy
//! may take.

use std::sync::OnceLock;

use serde::Deserialize;

use crate::backend::Precision;
use crate::error::{Error, Result};

/// The TOML sources of every known board, with the file name used in error messages.
const PROFILES: [(&str, &str); 2] = [
    ("jetson/boards/orin.toml", include_str!("../../jetson/boards/orin.toml")),
    ("jetson/boards/thor.toml", include_str!("../../jetson/boards/thor.toml")),
];

/// One board, as described by its `jetson/boards/<name>.toml`.
#[derive(Clone, Debug, PartialEq)]
pub struct BoardProfile {
    /// Short name (`orin`, `thor`), also the `--board` argument of `jetson/build.sh`.
    pub name: String,
    pub description: String,
    /// CUDA compute capability (major, minor) of the integrated GPU.
    pub compute_capability: (u32, u32),
    /// NVRTC target architecture (`sm_87`).
    pub arch: String,
    /// The CUDA version JetPack ships (`12.6`).
    pub cuda: String,
    /// cudarc's CUDA flavour for this board (`cuda-12060`): which driver API it binds to.
    pub cudarc_feature: String,
    /// The flashrt cargo feature that selects it (`cuda-12`).
    pub cargo_feature: String,
    /// The ROS 2 distribution of the board's Ubuntu (`humble`), a flashrt-ros2 feature.
    pub ros2_distro: String,
    /// Whether the tensor cores execute fp8 (e4m3) GEMMs.
    pub fp8_tensor_cores: bool,
    /// The precision to use on this board by default.
    pub precision: Precision,
    /// Memory budgets per module size, sorted by module size.
    pub memory: Vec<MemoryBudget>,
}

/// How much of a module's unified memory the policy may use.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBudget {
    /// Module DRAM as sold (32, 64, 128 GiB).
    pub module_gib: u64,
    /// What weights, arena and workspaces may take together, in MiB.
    pub budget_mib: u64,
    /// The [`REFERENCE_WORKLOADS`] this budget holds, by name: stated in the profile for readers,
    /// checked against the measured footprints when the profile is parsed.
    pub fits: Vec<String>,
}

/// A reference workload's device memory on the CUDA backend in bf16: its weights (tiled copies
/// included) and its arena of activations, as the backend logs them at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub name: &'static str,
    pub description: &'static str,
    pub weights_mib: u64,
    pub activations_mib: u64,
}

impl Workload {
    pub fn total_mib(&self) -> u64 {
        self.weights_mib + self.activations_mib
    }
}

/// The workloads whose fit the profiles state, measured on the H200 (the same plan and weights
/// as on a board; the cuBLASLt workspace is in the activations).
pub const REFERENCE_WORKLOADS: [Workload; 2] = [
    // bench/results/h200-cuda-checks.log: 6399.2 MiB weights, 214.4 MiB activations.
    Workload { name: "pi05-2v", description: "Pi0.5 full size, 2 cameras", weights_mib: 6400, activations_mib: 215 },
    // 5083.9 MiB weights and 103 MiB activations (2 views), measured with the embodiment's
    // ~7.9 M category-specific values folded in once; the embodiment tables hold them a second
    // time (the table entry beside the copy the products read: 15 MiB in bf16), and each further
    // switchable embodiment adds another 15 MiB.
    Workload {
        name: "gr00t-2v",
        description: "GR00T N1.7 full size (3.144 G parameters), 2 cameras, one embodiment",
        weights_mib: 5099,
        activations_mib: 103,
    },
];

impl MemoryBudget {
    /// Whether `workload` fits this budget.
    pub fn holds(&self, workload: &Workload) -> bool {
        workload.total_mib() <= self.budget_mib
    }
}

/// The file as written; converted into [`BoardProfile`] after validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    description: String,
    compute_capability: [u32; 2],
    arch: String,
    cuda: String,
    cudarc_feature: String,
    cargo_feature: String,
    ros2_distro: String,
    fp8_tensor_cores: bool,
    precision: String,
    memory: Vec<MemoryBudget>,
}

impl BoardProfile {
    /// Parses one profile; `source` names the file in errors.
    pub fn from_toml(source: &str, text: &str) -> Result<Self> {
        let bad = |message: String| Error::invalid(format!("board profile {source}"), message);
        let file: ProfileFile = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let [major, minor] = file.compute_capability;
        if file.arch != format!("sm_{major}{minor}") {
            return Err(bad(format!("arch {} does not match compute capability {major}.{minor}", file.arch)));
        }
        let precision = match file.precision.as_str() {
            "bf16" => Precision::Bf16,
            "fp8" => Precision::Fp8,
            other => return Err(bad(format!("precision {other:?}: expected \"bf16\" or \"fp8\""))),
        };
        if precision == Precision::Fp8 && !file.fp8_tensor_cores {
            return Err(bad("precision fp8 needs fp8_tensor_cores = true".into()));
        }
        let mut memory = file.memory;
        if memory.is_empty() || memory.iter().any(|m| m.budget_mib == 0 || m.budget_mib > m.module_gib * 1024) {
            return Err(bad("memory: needs at least one [[memory]] entry with 0 < budget_mib <= module_gib * 1024".into()));
        }
        for m in &memory {
            if let Some(unknown) = m.fits.iter().find(|f| !REFERENCE_WORKLOADS.iter().any(|w| w.name == f.as_str())) {
                let known: Vec<&str> = REFERENCE_WORKLOADS.iter().map(|w| w.name).collect();
                return Err(bad(format!("memory {} GiB: fits names {unknown:?}, not one of {known:?}", m.module_gib)));
            }
            for w in &REFERENCE_WORKLOADS {
                let stated = m.fits.iter().any(|f| f == w.name);
                if stated != m.holds(w) {
                    return Err(bad(format!(
                        "memory {} GiB: {} ({} MiB) {} the {} MiB budget, but fits {} it",
                        m.module_gib,
                        w.name,
                        w.total_mib(),
                        if m.holds(w) { "is within" } else { "exceeds" },
                        m.budget_mib,
                        if stated { "lists" } else { "omits" }
                    )));
                }
            }
        }
        memory.sort_by_key(|m| m.module_gib);
        Ok(BoardProfile {
            name: file.name,
            description: file.description,
            compute_capability: (major, minor),
            arch: file.arch,
            cuda: file.cuda,
            cudarc_feature: file.cudarc_feature,
            cargo_feature: file.cargo_feature,
            ros2_distro: file.ros2_distro,
            fp8_tensor_cores: file.fp8_tensor_cores,
            precision,
            memory,
        })
    }

    /// Every compiled-in profile (Orin, Thor).
    pub fn all() -> &'static [BoardProfile] {
        static ALL: OnceLock<Vec<BoardProfile>> = OnceLock::new();
        ALL.get_or_init(|| {
            // The sources are compiled in and checked by the unit tests, so a failure here is a
            // build defect, not a runtime condition.
            PROFILES
                .iter()
                .map(|(source, text)| BoardProfile::from_toml(source, text).expect("compiled-in board profile is valid"))
                .collect()
        })
    }

    /// The Jetson board with this GPU compute capability, or `None` for a discrete GPU (H200, RTX)
    /// or an unknown board.
    pub fn for_compute_capability(major: u32, minor: u32) -> Option<&'static BoardProfile> {
        Self::all().iter().find(|p| p.compute_capability == (major, minor))
    }

    /// The budget for a module reporting `total_bytes` of memory. The OS reports less than the
    /// module size (carve-outs for firmware and the display), so this picks the smallest module
    /// that is at least as large, or the largest known module.
    pub fn memory_budget_mib(&self, total_bytes: u64) -> u64 {
        let fits = self.memory.iter().find(|m| total_bytes <= m.module_gib << 30);
        fits.or(self.memory.last()).map_or(0, |m| m.budget_mib)
    }

    /// The warning the CUDA backend logs at open when a policy takes `used_bytes` of device
    /// memory (weights and activations) on a module reporting `total_bytes`, over this profile's
    /// budget; `None` within it.
    pub fn budget_warning(&self, used_bytes: u64, total_bytes: u64) -> Option<String> {
        let (used_mib, budget) = (used_bytes >> 20, self.memory_budget_mib(total_bytes));
        (used_mib > budget).then(|| {
            format!(
                "the policy takes {used_mib} MiB of device memory, over the {budget} MiB budget of the {} profile for a {} GiB module \
                 (fewer camera slots or a shorter prompt capacity shrink it)",
                self.name,
                total_bytes >> 30
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn orin_is_sm87_cuda12_bf16() {
        let orin = BoardProfile::for_compute_capability(8, 7).expect("orin profile");
        assert_eq!(orin.name, "orin");
        assert_eq!(orin.arch, "sm_87");
        assert_eq!(orin.cuda, "12.6");
        assert_eq!(
            (orin.cudarc_feature.as_str(), orin.cargo_feature.as_str(), orin.ros2_distro.as_str()),
            ("cuda-12060", "cuda-12", "humble")
        );
        assert!(!orin.fp8_tensor_cores);
        assert_eq!(orin.precision, Precision::Bf16);
        // A 32 GB module reports about 30.6 GiB, a 64 GB one about 61.4 GiB.
        assert_eq!(orin.memory_budget_mib(30 * GIB + GIB / 2), 12288);
        assert_eq!(orin.memory_budget_mib(61 * GIB), 24576);
    }

    #[test]
    fn thor_is_sm110_cuda13_fp8() {
        let thor = BoardProfile::for_compute_capability(11, 0).expect("thor profile");
        assert_eq!(thor.name, "thor");
        assert_eq!(thor.arch, "sm_110");
        assert_eq!(
            (thor.cudarc_feature.as_str(), thor.cargo_feature.as_str(), thor.ros2_distro.as_str()),
            ("cuda-13000", "cuda-13", "jazzy")
        );
        assert!(thor.fp8_tensor_cores);
        assert_eq!(thor.precision, Precision::Fp8);
        assert_eq!(thor.memory_budget_mib(122 * GIB), 49152);
        // Larger than any known module: the largest budget, not nothing.
        assert_eq!(thor.memory_budget_mib(512 * GIB), 49152);
    }

    #[test]
    fn memory_over_the_budget_is_a_warning_naming_both_numbers() {
        let orin = BoardProfile::for_compute_capability(8, 7).expect("orin profile");
        // Pi0.5 with 2 camera slots takes about 6 GiB: within a 32 GB Orin's 12 GiB budget.
        assert_eq!(orin.budget_warning(6 * GIB, 30 * GIB + GIB / 2), None);
        assert_eq!(orin.budget_warning(12 * GIB, 30 * GIB + GIB / 2), None);
        let warning = orin.budget_warning(13 * GIB, 30 * GIB + GIB / 2).expect("over budget");
        assert!(warning.contains("13312 MiB") && warning.contains("12288 MiB budget of the orin profile"), "{warning}");
    }

    /// GR00T N1.7 and Pi0.5 at full size fit every module's budget: Orin 32 GB (12 GiB budget) and
    /// 64 GB, Thor 64 and 128 GB; the profiles say so.
    #[test]
    fn full_size_workloads_fit_orin_and_thor() {
        let groot = REFERENCE_WORKLOADS.iter().find(|w| w.name == "gr00t-2v").expect("gr00t-2v");
        assert_eq!(groot.total_mib(), 5202);
        for board in BoardProfile::all() {
            for m in &board.memory {
                for w in &REFERENCE_WORKLOADS {
                    assert!(m.holds(w) && m.fits.iter().any(|f| f == w.name), "{} {} GiB: {}", board.name, m.module_gib, w.name);
                }
            }
        }
        // The smallest budget (a 32 GB Orin) leaves room for the embodiment tables of every
        // switchable embodiment the published checkpoint could hold (32 slots, 15 MiB each).
        assert!(groot.total_mib() + 32 * 15 <= 12288);
    }

    #[test]
    fn discrete_gpus_have_no_board_profile() {
        assert!(BoardProfile::for_compute_capability(9, 0).is_none()); // H100 / H200
        assert!(BoardProfile::for_compute_capability(8, 9).is_none()); // RTX 40xx
    }

    #[test]
    fn invalid_profiles_are_refused_with_the_reason() {
        let orin = PROFILES[0].1;
        let cases = [
            (orin.replace("arch = \"sm_87\"", "arch = \"sm_90\""), "does not match compute capability 8.7"),
            (orin.replace("precision = \"bf16\"", "precision = \"fp8\""), "needs fp8_tensor_cores"),
            (orin.replace("precision = \"bf16\"", "precision = \"int4\""), "precision \"int4\""),
            (orin.replace("budget_mib = 12288", "budget_mib = 99999"), "budget_mib <= module_gib"),
            (format!("unknown_key = 1\n{orin}"), "unknown field"),
            (
                orin.replacen("fits = [\"pi05-2v\", \"gr00t-2v\"]", "fits = [\"pi05-2v\"]", 1),
                "gr00t-2v (5202 MiB) is within the 12288 MiB budget, but fits omits it",
            ),
            (
                orin.replacen("budget_mib = 12288", "budget_mib = 6000", 1),
                "pi05-2v (6615 MiB) exceeds the 6000 MiB budget, but fits lists it",
            ),
            (orin.replacen("\"gr00t-2v\"]", "\"gr00t-2v\", \"gr00t-9v\"]", 1), "fits names \"gr00t-9v\""),
        ];
        for (text, expected) in cases {
            let err = BoardProfile::from_toml("test.toml", &text).unwrap_err().to_string();
            assert!(err.contains("board profile test.toml") && err.contains(expected), "{err}");
        }
    }
}
