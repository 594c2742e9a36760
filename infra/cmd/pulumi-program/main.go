// Command pulumi-program is the entry point the standard Pulumi CLI builds for this project
// (infra/Pulumi.yaml sets main: cmd/pulumi-program): `cd infra && pulumi up -s eks-dev`.
package main

import (
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

func main() {
	pulumi.Run(infra.Program)
}
