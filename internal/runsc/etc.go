package runsc

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// etcDenied lists paths under /etc (files, or directories with everything
// below them) that WriteSanitizedEtc never copies, even when they are
// world-readable: password hashes, privilege configuration, key material,
// configuration that commonly carries credentials, and host identity.
var etcDenied = map[string]bool{
	// Password hashes and the backups of the account databases.
	"shadow": true, "shadow-": true, "gshadow": true, "gshadow-": true,
	"passwd-": true, "group-": true, "subuid-": true, "subgid-": true,
	"security/opasswd": true, ".pwd.lock": true,
	// Privilege configuration and key material.
	"sudoers": true, "sudoers.d": true, "ssh": true, "ssl/private": true,
	"krb5.keytab": true, "ipsec.secrets": true, "ppp": true, "wireguard": true,
	"openvpn": true, "NetworkManager": true, "credstore": true,
	"credstore.encrypted": true, "letsencrypt": true,
	// Configuration that commonly holds tokens or proxy passwords; a
	// sandbox configures its tools itself.
	"environment": true, "environment.d": true, "npmrc": true, "pip.conf": true,
	"gitconfig": true, "wgetrc": true, "netrc": true, "boto.cfg": true,
	"apt/auth.conf": true, "apt/auth.conf.d": true,
	"docker": true, "containerd": true, "kubernetes": true, "rancher": true,
	"cni": true, "fusebox": true,
	// Host identity; hosts is regenerated below.
	"machine-id": true, "hostname": true, "hosts": true,
}

// sandboxHosts replaces the host's /etc/hosts, which names the host.
const sandboxHosts = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`

// WriteSanitizedEtc writes to dst (which must not exist) a copy of the
// host's /etc that is safe to show untrusted code. Only what every
// unprivileged host user can read is copied: directories that are
// world-readable and searchable, world-readable regular files, and symbolic
// links (as links, never followed); and of that, nothing listed in
// etcDenied (shadow and gshadow, sudoers, ssh, ssl/private, environment,
// package manager and container-runtime configuration, machine-id and the
// like). Sockets, fifos and devices are skipped, set-id bits dropped, and
// /etc/hosts is replaced by one naming only localhost.
//
// WriteBundle calls it for each bundle with a host-derived root unless
// BundleSpec.EtcDir names a copy made once. On a Debian host the copy is
// about 3 MiB in some 1,100 entries, 750 of them symbolic links
// (alternatives, rc.d, ssl/certs), too slow to make on the allocation
// path, so an allocator makes it once.
func WriteSanitizedEtc(dst string) error {
	return copySanitizedEtc("/etc", dst)
}

// copySanitizedEtc is WriteSanitizedEtc from src instead of /etc.
func copySanitizedEtc(src, dst string) error {
	srcRoot, err := os.OpenRoot(src)
	if err != nil {
		return fmt.Errorf("sanitising %s: %w", src, err)
	}
	defer srcRoot.Close()
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("sanitising %s: %w", src, err)
	}
	if err := os.Chmod(dst, 0o755); err != nil { // undo the umask
		return fmt.Errorf("sanitising %s: %w", src, err)
	}
	dstRoot, err := os.OpenRoot(dst)
	if err != nil {
		return fmt.Errorf("sanitising %s: %w", src, err)
	}
	defer dstRoot.Close()

	err = fs.WalkDir(srcRoot.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			return nil // unreadable: not copied
		}
		if p == "." {
			return nil
		}
		if etcDenied[p] {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		info, err := d.Info() // lstat
		if err != nil {
			return nil // vanished
		}
		perm := info.Mode().Perm()
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := srcRoot.Readlink(p)
			if err != nil {
				return fmt.Errorf("reading link %s: %w", p, err)
			}
			if err := dstRoot.Symlink(target, p); err != nil {
				return fmt.Errorf("creating link %s: %w", p, err)
			}
		case info.IsDir():
			if perm&0o005 != 0o005 {
				return fs.SkipDir
			}
			if err := dstRoot.Mkdir(p, perm); err != nil {
				return fmt.Errorf("creating directory %s: %w", p, err)
			}
			if err := dstRoot.Chmod(p, perm); err != nil {
				return fmt.Errorf("setting mode of %s: %w", p, err)
			}
		case info.Mode().IsRegular():
			if perm&0o004 == 0 {
				return nil
			}
			return copyWorldReadable(srcRoot, dstRoot, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sanitising %s: %w", src, err)
	}
	if err := dstRoot.WriteFile("hosts", []byte(sandboxHosts), 0o644); err != nil {
		return fmt.Errorf("sanitising %s: writing hosts: %w", src, err)
	}
	return nil
}

// errNotWorldReadable reports a file that changed between the walk's lstat
// and its open.
var errNotWorldReadable = errors.New("not a world-readable regular file")

// copyWorldReadable copies regular file p, re-checking on the open file that
// it is still world-readable: the walk's lstat and the open are separate
// steps, and os.Root would follow a symbolic link put there in between.
func copyWorldReadable(srcRoot, dstRoot *os.Root, p string) error {
	in, err := srcRoot.Open(p)
	if err != nil {
		return nil // vanished or unreadable: not copied
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if !info.Mode().IsRegular() || info.Mode().Perm()&0o004 == 0 {
		return fmt.Errorf("copying %s: %w", p, errNotWorldReadable)
	}
	perm := info.Mode().Perm()
	out, err := dstRoot.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("creating %s: %w", p, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", p, err)
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return fmt.Errorf("setting mode of %s: %w", p, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}
