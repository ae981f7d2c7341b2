package devstack

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// adminTokenFile is where a stack without FLO_ADMIN_TOKEN keeps the admin
// token it made, under DataDir, so a restarted `flo dev` keeps the same key.
const adminTokenFile = "admin-token"

// adminTokenPrefix makes a generated token read as a Flo admin token wherever
// it is pasted (shell history, a secret store).
const adminTokenPrefix = "flo_admin_"

// resolveAdminToken returns the configured admin token, else the one in
// DataDir's admin-token file, creating that file (readable by its owner only)
// with a new random token when there is none.
func resolveAdminToken(cfg Config) (string, error) {
	if cfg.AdminToken != "" {
		return cfg.AdminToken, nil
	}
	path := filepath.Join(cfg.DataDir, adminTokenFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		token := strings.TrimSpace(string(data))
		if token == "" {
			return "", fmt.Errorf("admin token file %s is empty: delete it to make a new token", path)
		}
		return token, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("read admin token: %w", err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", fmt.Errorf("make admin token: %w", err)
	}
	token := adminTokenPrefix + hex.EncodeToString(secret)
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return "", fmt.Errorf("admin token dir: %w", err)
	}
	// Written aside and linked into place: two stacks starting on one data
	// dir at once must agree on one token, and neither may read a half-written
	// file; the one whose link fails reads the other's.
	tmp, err := os.CreateTemp(cfg.DataDir, adminTokenFile+".*")
	if err != nil {
		return "", fmt.Errorf("create admin token file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(token + "\n"); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write admin token: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write admin token: %w", err)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return resolveAdminToken(cfg)
	} else if err != nil {
		return "", fmt.Errorf("save admin token: %w", err)
	}
	return token, nil
}
