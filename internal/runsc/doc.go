// Package runsc runs fusebox sandboxes as OCI containers under gVisor by
// driving the pinned runsc binary through its command line.
//
// One fusebox sandbox is one gVisor sandbox holding exactly one container,
// whose id is also the sandbox id. The package has two halves:
//
//   - Runtime wraps the runsc subcommands the local allocator needs (create,
//     start, kill, delete, state, list, exec, and run for one-shot commands
//     such as build steps). Every call passes the same
//     global flags (--root, --network, --host-uds, --platform): runsc does not
//     remember them, and a later call without them silently falls back to
//     runsc's defaults.
//   - WriteBundle writes an OCI bundle (config.json plus, for the host-derived
//     root, a rootfs directory) from a BundleSpec: read-only root, no network
//     namespace unless one is given, a memory-backed workspace, and memory,
//     CPU and pids limits; or, for building images, a writable root
//     (BundleSpec.RootWritable).
//
// Container ids are fixed-width (see ID and ValidID) because runsc resolves an
// id by prefix: with variable-width ids "fbx-1" would also name "fbx-10".
//
// Integration tests and benchmarks use the helpers in the runsctest
// subpackage, which locate the pinned binary and clean containers up.
package runsc
