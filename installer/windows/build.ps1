# Windows bundle (x64): PyInstaller's one folder (llamadesk.exe without a console window, llamadesk-cli.exe with
# one) around a llama-cpp-python wheel of installer/wheel.sh, smoke-tested headless, then packed twice:
# dist\llamadesk-<version>-windows-x64[-<variant>].zip (portable) and, with Inno Setup 6's ISCC, the per-user
# installer ...-setup.exe from installer\windows\llamadesk.iss.
# Usage: pwsh installer\windows\build.ps1 -Wheel PATH [-Variant cpu|vulkan|cuda] [-Models DIR] [-NoInstaller]
#   -Wheel: the wheel installer/wheel.sh built (it runs in Git Bash: `installer/wheel.sh cpu` prints the path)
#   -Models: the starter set's files for the smoke test, made there when missing (installer\smoke_models.py)
param(
    [Parameter(Mandatory = $true)][string] $Wheel,
    [ValidateSet("cpu", "vulkan", "cuda")][string] $Variant = "cpu",
    [string] $Models = "",
    [switch] $NoInstaller,
    [string] $Python = "python"
)
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")

function Invoke-Native {
    # PowerShell does not stop on a failing program by itself. A simple function (no param block), so that
    # arguments like -m reach the program instead of being taken for this function's parameters.
    $program, $rest = $args
    & $program @rest
    if ($LASTEXITCODE -ne 0) { throw "$program $rest failed with exit code $LASTEXITCODE" }
}

$venv = "build\bundle-venv"
$py = "$venv\Scripts\python.exe"
if (-not (Test-Path $py)) {
    Invoke-Native $Python -m venv $venv
    Invoke-Native $py -m pip install -q --upgrade pip
}
# the wheel first and on its own: a previous variant's llama-cpp-python of the same version may be installed
Invoke-Native $py -m pip install -q --force-reinstall --no-deps $Wheel
Invoke-Native $py -m pip install -q $Wheel . "pyinstaller>=6.5"
Invoke-Native $py installer\make_icons.py build\icons
Invoke-Native $py -m PyInstaller --noconfirm --clean --distpath dist --workpath build\pyinstaller build_spec.spec

$modelArgs = @()
if ($Models) { $modelArgs = @($Models) }
$modelDir = (& $py installer\smoke_models.py @modelArgs | Select-Object -Last 1)
if ($LASTEXITCODE -ne 0) { throw "installer\smoke_models.py failed" }
Invoke-Native $py installer\smoke_test.py dist\llamadesk\llamadesk-cli.exe --models $modelDir

$version = (& $py -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
$suffix = if ($Variant -eq "cpu") { "" } else { "-$Variant" }
$name = "llamadesk-$version-windows-x64$suffix"
Compress-Archive -Path dist\llamadesk -DestinationPath "dist\$name.zip" -Force
if ($NoInstaller) { exit 0 }
$iscc = (Get-Command iscc.exe -ErrorAction SilentlyContinue).Source
if (-not $iscc) { $iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
if (-not (Test-Path $iscc)) {
    throw "Inno Setup 6 (ISCC.exe) not found: install it, or pass -NoInstaller for the zip alone"
}
Invoke-Native $iscc "/DAppVersion=$version" "/DOutputName=$name-setup" installer\windows\llamadesk.iss
Get-ChildItem "dist\$name*" | Format-Table Name, Length
