//! Finds MLX (the official binary distribution) and builds the C++ shim.
//!
//! MLX comes from `MLX_DIR` (a folder with `include/mlx` and `lib/libmlx.*`,
//! e.g. the `mlx/` folder of an unpacked wheel), else from the pinned wheel,
//! fetched once with `pip download` into `$SPECD_HOME/mlx/` (default
//! `~/.cache/specd/mlx/`). Binaries get an rpath to it, so they run without
//! environment variables.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_VERSION: &str = "0.32.4";

fn wheel_package() -> String {
    if let Ok(p) = env::var("SPECD_MLX_WHEEL") {
        return p;
    }
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let pkg = if os == "macos" {
        "mlx-metal"
    } else if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        "mlx-cuda-12"
    } else {
        "mlx-cpu"
    };
    format!("{pkg}=={MLX_VERSION}")
}

fn cache_root() -> PathBuf {
    specd_store::home().join("mlx")
}

fn fetch_wheel() -> PathBuf {
    let pkg = wheel_package();
    let dest = cache_root().join(pkg.replace("==", "-"));
    let root = dest.join("mlx");
    if root.join("include/mlx/mlx.h").exists() {
        return root;
    }
    if pkg.starts_with("mlx-cuda") {
        return install_cuda_wheel(&pkg, &dest);
    }
    let dl = dest.join("download");
    std::fs::create_dir_all(&dl).expect("create MLX cache dir");
    eprintln!("fetching {pkg} into {}", dest.display());
    let ok = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&dl)
        .arg(&pkg)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "`pip download {pkg}` failed: python3 with pip is needed to fetch MLX (or set MLX_DIR)"
    );
    let wheel = std::fs::read_dir(&dl)
        .expect("read download dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("pip download left no wheel");
    // A wheel is a zip; python's zipfile keeps us free of an unzip dependency.
    let ok = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dest)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "could not unpack {}", wheel.display());
    assert!(
        root.join("include/mlx/mlx.h").exists(),
        "the wheel has no mlx/include"
    );
    root
}

/// The CUDA wheel's libmlx finds the NVIDIA libraries through an rpath into
/// sibling packages (`$ORIGIN/../../nvidia/...`), so it is installed with its
/// dependencies (`pip install --target`), not just unpacked.
fn install_cuda_wheel(pkg: &str, dest: &Path) -> PathBuf {
    let site = dest.join("site");
    let root = site.join("mlx");
    if root.join("include/mlx/mlx.h").exists() {
        return root;
    }
    eprintln!(
        "installing {pkg} (and the NVIDIA libraries it needs) into {}",
        site.display()
    );
    let ok = Command::new("python3")
        .args(["-m", "pip", "install", "--only-binary=:all:", "--target"])
        .arg(&site)
        .arg(pkg)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "`pip install --target {} {pkg}` failed", site.display());
    root
}

fn find_openblas() -> Option<PathBuf> {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        if Path::new(dir).join("libopenblas.so").exists() {
            return Some(PathBuf::from(dir));
        }
    }
    None
}

fn main() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=SPECD_HOME");
    println!("cargo:rerun-if-env-changed=SPECD_MLX_WHEEL");
    println!("cargo:rerun-if-changed=src/shim.h");
    println!("cargo:rerun-if-changed=src/shim.cc");
    for f in [
        "kernels.cc",
        "kernels_pool.h",
        "kernels_pool.cc",
        "kernels_isa.h",
        "kernels_isa.cc",
        "kernels_common.h",
        "kernels_common.cc",
        "kernels_qmm.h",
        "kernels_qmm.cc",
        "kernels_attention.h",
        "kernels_attention.cc",
        "kernels_rows.h",
        "kernels_rows.cc",
        "pages.h",
        "pages.cc",
        "qmm.h",
        "qmm_simd.h",
        "qmm_tiles.h",
        "top2.h",
        "attn_rows_walk.h",
        "qmm_avx2.h",
        "qmm_avx2.cc",
        "qmm_q8_avx2.cc",
        "qmm_avx512.cc",
        "qmm_vnni.cc",
        "waiting.h",
    ] {
        println!("cargo:rerun-if-changed=src/{f}");
    }
    println!("cargo:rerun-if-changed=src/bridge.rs");

    let root = match env::var("MLX_DIR") {
        Ok(d) => PathBuf::from(d),
        Err(_) => fetch_wheel(),
    };
    let include = root.join("include");
    let lib = root.join("lib");
    assert!(
        include.join("mlx/mlx.h").exists(),
        "no include/mlx/mlx.h under {}",
        root.display()
    );

    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let mut build = cxx_build::bridge("src/bridge.rs");
    build
        .file("src/shim.cc")
        .file("src/kernels.cc")
        .file("src/kernels_pool.cc")
        .file("src/kernels_isa.cc")
        .file("src/kernels_common.cc")
        .file("src/kernels_qmm.cc")
        .file("src/kernels_attention.cc")
        .file("src/kernels_rows.cc")
        .file("src/pages.cc")
        .include(&include)
        .std("c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .opt_level(2);
    if os == "linux" {
        // MLX's CPU GEMM calls cblas_sgemm; the wheel bundles reference BLAS,
        // whose cost grows linearly in rows and kills speculative verifies.
        let dir = find_openblas().expect(
            "OpenBLAS not found: install it (Debian: apt-get install libopenblas-dev libopenblas0-pthread)",
        );
        build.define("SPECD_OPENBLAS", None);
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch == "x86_64" {
        // The SIMD kernels, each in its own unit with its instruction set
        // on; the kernels pick one at run time from the CPU's features
        // (kernels_isa.cc).
        build.define("SPECD_X86_KERNELS", None);
        for (file, flags) in [
            ("src/qmm_avx2.cc", &["-mavx2", "-mfma", "-mf16c"][..]),
            ("src/qmm_q8_avx2.cc", &["-mavx2", "-mfma", "-mf16c"][..]),
            (
                "src/qmm_avx512.cc",
                &["-mavx512f", "-mavx512bw", "-mavx2", "-mfma", "-mf16c"][..],
            ),
            (
                "src/qmm_vnni.cc",
                &[
                    "-mavx512f",
                    "-mavx512bw",
                    "-mavx512vnni",
                    "-mavx2",
                    "-mfma",
                    "-mf16c",
                ][..],
            ),
        ] {
            let mut b = cc::Build::new();
            b.cpp(true)
                .file(file)
                .std("c++20")
                .opt_level(3)
                // GCC 12's AVX-512 intrinsics self-initialize a dummy
                // (`__Y = __Y`) and then warn about it once inlined.
                .flag_if_supported("-Wno-uninitialized")
                .flag_if_supported("-Wno-maybe-uninitialized");
            for f in flags {
                b.flag(f);
            }
            let name = Path::new(file).file_stem().unwrap().to_str().unwrap();
            b.compile(&format!("specd_{name}"));
        }
    }
    build.compile("specd_mlx_shim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    if os == "linux" {
        // Before mlx, so OpenBLAS comes first among the binary's needed libraries.
        println!("cargo:rustc-link-lib=dylib=openblas");
    }
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // Dependents read this as DEP_MLX_LIB_DIR to set the same rpath.
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:root={}", root.display());
}
