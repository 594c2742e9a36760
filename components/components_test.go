package components

import (
	"errors"
	"testing"
)

const digest = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"

func TestValidateImage(t *testing.T) {
	for _, ok := range []string{
		"registry.example.com/fusebox/manager@sha256:" + digest,
		"registry.example.com:5000/fusebox/manager@sha256:" + digest,
		"manager@sha256:" + digest,
	} {
		if err := ValidateImage(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{
		"",
		"registry.example.com/fusebox/manager",
		"registry.example.com/fusebox/manager:v1.2.3",
		"registry.example.com/fusebox/manager:latest",
		"registry.example.com/fusebox/manager:v1@sha256:" + digest,
		"registry.example.com/fusebox/manager@sha256:" + digest[:63],
		"registry.example.com/fusebox/manager@sha256:" + digest + "0",
		"registry.example.com/fusebox/manager@sha512:" + digest,
		"Registry.example.com/fusebox/manager@sha256:" + digest,
	} {
		if err := ValidateImage(bad); !errors.Is(err, ErrImageNotPinned) {
			t.Errorf("%q: want ErrImageNotPinned, got %v", bad, err)
		}
	}
}

func TestParseCloud(t *testing.T) {
	for _, c := range Clouds {
		if got, err := ParseCloud(string(c)); err != nil || got != c {
			t.Errorf("%s: %v %v", c, got, err)
		}
	}
	for _, bad := range []string{"", "EKS", "openstack"} {
		if _, err := ParseCloud(bad); !errors.Is(err, ErrUnknownCloud) {
			t.Errorf("%q: want ErrUnknownCloud, got %v", bad, err)
		}
	}
}
