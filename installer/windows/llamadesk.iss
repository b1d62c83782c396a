; Inno Setup 6 script: installs dist\llamadesk\ (installer\windows\build.ps1 builds it) for the current user, with
; a Start menu entry and an optional desktop one. Settings, models and caches live in the user's AppData
; (platformdirs), outside {app}: an upgrade replaces the program folder whole, and uninstalling keeps them.
; Build: ISCC /DAppVersion=0.1.0 /DOutputName=llamadesk-0.1.0-windows-x64-setup installer\windows\llamadesk.iss
#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef OutputName
  #define OutputName "llamadesk-" + AppVersion + "-windows-x64-setup"
#endif

[Setup]
; one AppId for every version and variant, so installing one replaces another
AppId={{5E0C5A5B-3B7E-4C41-9F0B-6C1D3A1F7E21}
AppName=llamadesk
AppVersion={#AppVersion}
AppPublisher=llamadesk
DefaultDirName={autopf}\llamadesk
DefaultGroupName=llamadesk
DisableProgramGroupPage=yes
; per user by default (no administrator needed); the dialog offers all users
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename={#OutputName}
Compression=lzma2
SolidCompression=yes
WizardStyle=modern
UninstallDisplayIcon={app}\llamadesk.exe
; a running llamadesk holds its files open: Setup asks to close it
CloseApplications=yes

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "..\..\dist\llamadesk\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[InstallDelete]
; files of an older version that this one no longer carries (another variant's GPU libraries, say)
Type: filesandordirs; Name: "{app}\_internal"

[Icons]
Name: "{autoprograms}\llamadesk"; Filename: "{app}\llamadesk.exe"
Name: "{autodesktop}\llamadesk"; Filename: "{app}\llamadesk.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\llamadesk.exe"; Description: "{cm:LaunchProgram,llamadesk}"; Flags: nowait postinstall skipifsilent
